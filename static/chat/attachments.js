// Files attached in the composer: chosen by the button, pasted or dropped; each uploaded at once over
// HTTP (`POST /api/files`, docs/files.md) with its progress shown, so a send names them by `fileId`
// and no large frame goes over the socket. A failed upload says why and keeps the message. Browser only.

import { scheduleRender } from "./store.js";
import { els } from "./view.js";

const TYPES = new Set([
  "image/png",
  "image/jpeg",
  "image/gif",
  "image/webp",
  "text/plain",
  "text/markdown",
  "text/csv",
  "application/json",
  "application/pdf",
]);
const MAX_ATTACHMENTS = 4;

let counter = 0;
/** The composer's files, in the order added: {id, name, size, mime, status, progress, error, fileId, preview}. */
export const attached = [];

/** A file's size for people. */
export function formatSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
}

function csrfToken() {
  const found = document.cookie.split("; ").find((c) => c.startsWith("csrftoken="));
  return found ? decodeURIComponent(found.slice("csrftoken=".length)) : "";
}

/** Upload `item`'s file; its status, progress and error follow the request. */
function upload(item, file) {
  const form = new FormData();
  form.append("file", file, item.name);
  const xhr = new XMLHttpRequest();
  item.xhr = xhr;
  xhr.open("POST", "/api/files");
  xhr.setRequestHeader("X-CSRFToken", csrfToken());
  xhr.upload.addEventListener("progress", (ev) => {
    if (ev.lengthComputable) item.progress = ev.loaded / ev.total;
    scheduleRender();
  });
  xhr.addEventListener("load", () => {
    let body = null;
    try {
      body = JSON.parse(xhr.responseText);
    } catch {
      body = null;
    }
    if (xhr.status === 201 && body && body.id) {
      Object.assign(item, { status: "done", progress: 1, fileId: body.id, mime: body.mimeType, size: body.size });
    } else {
      const why = (body && body.error && body.error.message) || `the upload failed (HTTP ${xhr.status})`;
      Object.assign(item, { status: "failed", error: why });
    }
    scheduleRender();
  });
  xhr.addEventListener("error", () => {
    Object.assign(item, { status: "failed", error: "the upload failed: no connection to the server" });
    scheduleRender();
  });
  xhr.send(form);
}

/** Attach `files` (a FileList or array): each is uploaded; what cannot be is shown failed, with why. */
export function addFiles(files) {
  for (const file of Array.from(files || [])) {
    counter += 1;
    const image = file.type.startsWith("image/");
    const item = {
      id: `att-${counter}`,
      name: file.name || (image ? "pasted-image.png" : "file"),
      size: file.size,
      mime: file.type || "",
      status: "uploading",
      progress: 0,
      error: null,
      fileId: null,
      preview: image ? URL.createObjectURL(file) : null,
    };
    attached.push(item);
    if (attached.length > MAX_ATTACHMENTS) {
      Object.assign(item, { status: "failed", error: `at most ${MAX_ATTACHMENTS} files per message` });
    } else if (file.type && !TYPES.has(file.type) && !/\.(md|markdown|csv|json|txt)$/i.test(file.name)) {
      Object.assign(item, { status: "failed", error: "this type of file is not accepted" });
    } else {
      upload(item, file);
    }
  }
  scheduleRender();
}

/** Take `item` (by id) out of the composer, stopping its upload. */
export function removeAttachment(id) {
  const at = attached.findIndex((a) => a.id === id);
  if (at < 0) return;
  const [item] = attached.splice(at, 1);
  if (item.xhr && item.status === "uploading") item.xhr.abort();
  if (item.preview) URL.revokeObjectURL(item.preview);
  scheduleRender();
}

/** Whether the composer's files stop a send, and why ("" when they do not). */
export function attachmentsBlock() {
  if (attached.some((a) => a.status === "uploading")) return "Uploading…";
  if (attached.some((a) => a.status === "failed")) return "Remove the file that failed to upload, or attach it again.";
  return "";
}

/** The composer's uploaded files as a send names them; the composer is then emptied of them. */
export function takeAttachments() {
  const out = attached
    .filter((a) => a.status === "done")
    .map((a) => ({ fileId: a.fileId, fileName: a.name, mimeType: a.mime, size: a.size }));
  for (const a of attached.splice(0)) if (a.preview) URL.revokeObjectURL(a.preview);
  return out;
}

/** A chip for an attachment: a thumbnail (images) or the type, its name and size. */
export function chip(doc, { name, size, mime, src }) {
  const el = doc.createElement("span");
  el.className = "attachment-chip";
  el.dataset.testid = "attachment-chip";
  if (mime && mime.startsWith("image/") && src) {
    const img = doc.createElement("img");
    img.className = "attachment-thumb";
    img.dataset.testid = "attachment-thumb";
    img.alt = name;
    img.src = src;
    el.append(img);
  }
  const label = doc.createElement("span");
  label.className = "attachment-name";
  label.textContent = `${name} · ${formatSize(size || 0)}`;
  el.append(label);
  return el;
}

/** Draw the composer's files: chips with progress, the reason of a failure, a remove button. */
export function renderAttachments() {
  const box = els.attachments;
  const signature = attached.map((a) => `${a.id}:${a.status}:${Math.round(a.progress * 100)}`).join("|");
  if (box.dataset.sig === signature) return;
  box.dataset.sig = signature;
  box.replaceChildren();
  box.hidden = attached.length === 0;
  for (const a of attached) {
    const el = chip(document, { name: a.name, size: a.size, mime: a.mime, src: a.preview });
    el.dataset.state = a.status;
    if (a.status === "uploading") {
      const bar = document.createElement("progress");
      bar.max = 1;
      bar.value = a.progress;
      bar.dataset.testid = "upload-progress";
      el.append(bar);
    }
    if (a.status === "failed") {
      const why = document.createElement("span");
      why.className = "attachment-error";
      why.dataset.testid = "upload-error";
      why.textContent = a.error;
      el.append(why);
    }
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "btn btn-quiet btn-small";
    remove.dataset.testid = "remove-attachment";
    remove.setAttribute("aria-label", `Remove ${a.name}`);
    remove.textContent = "×";
    remove.addEventListener("click", () => removeAttachment(a.id));
    el.append(remove);
    box.append(el);
  }
}

/** The button, paste and drag-and-drop. */
export function wireAttachments() {
  els.attach.addEventListener("click", () => els.attachInput.click());
  els.attachInput.addEventListener("change", () => {
    addFiles(els.attachInput.files);
    els.attachInput.value = "";
  });
  els.composer.addEventListener("paste", (ev) => {
    const files = ev.clipboardData ? ev.clipboardData.files : null;
    if (files && files.length) {
      ev.preventDefault();
      addFiles(files);
    }
  });
  els.form.addEventListener("dragover", (ev) => {
    if (ev.dataTransfer && Array.from(ev.dataTransfer.types).includes("Files")) {
      ev.preventDefault();
      els.form.dataset.drop = "1";
    }
  });
  els.form.addEventListener("dragleave", () => delete els.form.dataset.drop);
  els.form.addEventListener("drop", (ev) => {
    delete els.form.dataset.drop;
    if (ev.dataTransfer && ev.dataTransfer.files.length) {
      ev.preventDefault();
      addFiles(ev.dataTransfer.files);
    }
  });
}
