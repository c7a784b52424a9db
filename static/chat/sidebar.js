// The sidebar as a drawer at phone width: opening and closing it.
//
// At phone width the closed sidebar is visibility:hidden (app.css), so it takes no keyboard focus.
// Opening it moves focus into it; closing it gives focus back to the toggle.

import { els } from "./view.js";

/** Is the drawer open? */
export function sidebarIsOpen() {
  return document.body.classList.contains("sidebar-open");
}

/** Open the drawer; focus goes to the open session's row (or New chat). */
export function openSidebar() {
  document.body.classList.add("sidebar-open");
  els.sidebarToggle.setAttribute("aria-expanded", "true");
  const current = els.sessionList.querySelector('[aria-current="true"]');
  (current || els.newSession).focus();
}

/** Close the drawer, when open; focus goes back to its toggle. */
export function closeSidebar() {
  if (!sidebarIsOpen()) return;
  document.body.classList.remove("sidebar-open");
  els.sidebarToggle.setAttribute("aria-expanded", "false");
  if (getComputedStyle(els.sidebarToggle).display !== "none") els.sidebarToggle.focus();
}
