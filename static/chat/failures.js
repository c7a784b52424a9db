// Failures the user should hear about become a notice saying what failed (texts.js `failureText`).

import { dispatch } from "./store.js";
import { failureText } from "./texts.js";

/** A notice saying what failed (`failureText`); a fault in this page also goes to the console, with its stack. */
export function reportFailure(what, error) {
  if (!(error && error.name === "RequestError") && error instanceof Error) console.error(error);
  dispatch({ type: "notice", text: failureText(what, error) });
}

/** A user action whose own exceptions (faults in this page, not gateway errors) become a notice naming them. */
export function guarded(what, action) {
  return async (...args) => {
    try {
      await action(...args);
    } catch (error) {
      reportFailure(what, error);
    }
  };
}
