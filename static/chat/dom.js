// DOM writes that touch the document only when the value changed, for the page's renderers and the
// tool card. Only `textContent`, attributes and `hidden` are used, so the Node tests run them against a
// small fake document.

/** Set `node`'s text. */
export function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

/** Set attribute `name` of `node`; an empty or missing value removes it. */
export function setAttr(node, name, value) {
  if (value === "" || value == null) {
    if (node.hasAttribute(name)) node.removeAttribute(name);
  } else if (node.getAttribute(name) !== value) {
    node.setAttribute(name, value);
  }
}

/** Show or hide `node`. */
export function setHidden(node, hidden) {
  if (node.hidden !== hidden) node.hidden = hidden;
}
