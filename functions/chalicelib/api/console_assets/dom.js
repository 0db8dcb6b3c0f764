// Building the page without parsing HTML: every text becomes a text node, never markup.
// (The Content-Security-Policy enforces Trusted Types with no policy: an HTML sink would throw.)

let nextId = 0;

/** A fresh element id, unique in the page (labels and descriptions point at ids). */
export function uid(prefix) {
  nextId += 1;
  return `${prefix}-${nextId}`;
}

/**
 * h("button", { type: "button", onclick: f }, "Sign in"): an element with attributes, event
 * handlers (on...) and children (nodes or text). `value` is set as the property, so what a
 * field holds never becomes an attribute of the page; false, null and undefined leave a name out.
 */
export function h(tag, props = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else if (name === "value") element.value = value;
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  append(element, children);
  return element;
}

export function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

/** Replace everything inside `element` with `children`. */
export function fill(element, ...children) {
  element.replaceChildren();
  return append(element, children);
}
