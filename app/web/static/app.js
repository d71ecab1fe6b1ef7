// The web chat app: one page on the server's own OpenAI and Ollama APIs.
// Conversations live in this browser (localStorage); replies stream over SSE and carry the
// engine's own figures (the `timings` of the last chunk), shown under each reply.
// Pictures for a vision model go with a message as OpenAI `image_url` parts (data URLs),
// scaled down here first; only small thumbnails of them are kept (see "pictures" below).

const $ = (selector) => document.querySelector(selector);
const STORE_KEY = "localinfer.chats.v1";

// ------------------------------------------------------------------ the API key
// `localinfer app` opens the page as /#key=…: kept for this tab, dropped from the address bar.
const fragment = new URLSearchParams(location.hash.slice(1));
if (fragment.get("key")) {
  sessionStorage.setItem("localinfer.key", fragment.get("key"));
  history.replaceState(null, "", location.pathname);
}

function headers(extra = {}) {
  const key = sessionStorage.getItem("localinfer.key");
  return { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}), ...extra };
}

async function errorText(response) {
  try {
    const body = await response.json();
    const error = body.error;
    return typeof error === "string" ? error : error?.message || `the server answered ${response.status}`;
  } catch {
    return `the server answered ${response.status}`;
  }
}

// ------------------------------------------------------------------ state
const state = {
  chats: loadChats(),
  current: null,     // the open conversation
  models: [],        // rows from /localinfer/models
  model: null,       // the model picked
  controller: null,  // aborts the reply being written
  vision: null,      // whether the model takes pictures: true, false, or null (not known)
  attachments: [],   // pictures waiting to go with the next message: {name, send, thumb}
  note: "",          // what saving had to give up, shown again once a reply is done
};

function loadChats() {
  try {
    return JSON.parse(localStorage.getItem(STORE_KEY)) || [];
  } catch {
    return [];
  }
}

function saveChats() {
  const dropped = keepPicturesUnderCap();
  if (dropped) {
    state.note = `${dropped} older picture${dropped > 1 ? "s were" : " was"} removed from this ` +
      `browser's storage (pictures are kept up to ${PICTURE_STORE_CAP / 2 ** 20} MB)`;
    status(state.note);
  }
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify(state.chats));
  } catch (error) {
    // the conversation stays on the page; only a reload or another tab would lose it
    status(error.name === "QuotaExceededError" || /quota/i.test(error.message)
      ? "This browser's storage is full: this conversation is not saved (it stays on this " +
        "page until you close it) — delete old conversations to make room."
      : `Not saved in this browser: ${error.message}`, true);
  }
}

// ------------------------------------------------------------------ pictures
// A picture attached is scaled in the browser twice: to SEND_SIDE px on its longer side as a
// JPEG, which goes to the model (a projector reads a few hundred pixels anyway — Gemma 3 896
// — and at a few hundred KB a photo, several fit in the server's 8 MB request), and to
// THUMB_SIDE px, a thumbnail of at most THUMB_MAX characters, which is what the conversation
// keeps in localStorage. The full pictures live only as long as the page: a conversation opened again
// after a reload sends its thumbnails. All the thumbnails of all conversations together are
// held to PICTURE_STORE_CAP (2 MB of the origin's ~5 MB of localStorage); past it, the
// oldest conversations' pictures are dropped from storage, oldest first, and say so where
// they were — the words of every message stay.
const SEND_SIDE = 1024;
const THUMB_SIDE = 256;
const THUMB_MAX = 48 * 1024;
const PICTURE_STORE_CAP = 2 * 2 ** 20;
const MAX_PICTURES = 16;  // a message's, as the server takes at most 16 a request
const sentPictures = new WeakMap();  // a message → the full pictures it was sent with

function isPicture(url) {
  return typeof url === "string" && url.startsWith("data:image/");
}

function scaled(bitmap, side, quality) {
  const scale = Math.min(1, side / Math.max(bitmap.width, bitmap.height));
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(1, Math.round(bitmap.width * scale));
  canvas.height = Math.max(1, Math.round(bitmap.height * scale));
  const context = canvas.getContext("2d");
  context.fillStyle = "#fff";  // JPEG has no transparency: a transparent part reads as white
  context.fillRect(0, 0, canvas.width, canvas.height);
  context.drawImage(bitmap, 0, 0, canvas.width, canvas.height);
  return canvas.toDataURL("image/jpeg", quality);
}

async function readPicture(file) {
  const bitmap = await createImageBitmap(file);  // throws for what is not a picture
  try {
    let thumb = null;
    for (const quality of [0.8, 0.6, 0.4]) {
      thumb = scaled(bitmap, THUMB_SIDE, quality);
      if (thumb.length <= THUMB_MAX) break;
    }
    if (thumb.length > THUMB_MAX) thumb = scaled(bitmap, THUMB_SIDE / 2, 0.5);
    return { name: file.name, send: scaled(bitmap, SEND_SIDE, 0.9), thumb };
  } finally {
    bitmap.close();
  }
}

async function attach(files) {
  files = [...files];
  if (!files.length) return;
  if (state.vision === false) {
    status(`${state.model} takes no pictures — pick a vision model to attach them.`, true);
    return;
  }
  for (const file of files) {
    if (file.type && !file.type.startsWith("image/")) {
      status(`“${file.name}” is not a picture — attach PNG, JPEG, WebP, GIF or BMP images.`, true);
      continue;
    }
    if (state.attachments.length >= MAX_PICTURES) {
      status(`At most ${MAX_PICTURES} pictures a message.`, true);
      break;
    }
    try {
      state.attachments.push(await readPicture(file));
      status(`${file.name} attached`);
    } catch {
      status(`“${file.name}” could not be read as a picture.`, true);
    }
  }
  showAttachments();
}

function showAttachments() {
  const box = $("#attachments");
  box.replaceChildren();
  state.attachments.forEach((picture, index) => {
    const chip = document.createElement("div");
    chip.className = "chip";
    const image = document.createElement("img");
    image.src = picture.thumb;
    image.alt = picture.name;
    image.title = picture.name;
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "×";
    remove.title = `Remove ${picture.name}`;
    remove.addEventListener("click", () => {
      state.attachments.splice(index, 1);
      showAttachments();
    });
    chip.append(image, remove);
    box.append(chip);
  });
  box.hidden = state.attachments.length === 0;
}

// Whether the chosen model takes pictures, from /api/show's capabilities; a model not yet
// pulled is not known until it is (null: the server's answer decides).
async function checkVision(name) {
  let vision = null;
  try {
    const response = await fetch("/api/show", {
      method: "POST", headers: headers(), body: JSON.stringify({ model: name }),
    });
    if (response.ok) vision = ((await response.json()).capabilities || []).includes("vision");
  } catch {
    // no answer: not known
  }
  if (name === state.model) showVision(vision);  // (unless another was picked meanwhile)
}

function showVision(vision) {
  state.vision = vision;
  const name = state.model;
  const button = $("#attach");
  button.disabled = vision === false;
  button.title = vision === false
    ? `${name} takes no pictures — pick a vision model to attach them`
    : "Attach pictures (or drop or paste them here)";
}

// Thumbnails of every stored conversation over PICTURE_STORE_CAP: the oldest go, the
// message just written keeps its own. The number dropped.
function keepPicturesUnderCap() {
  const held = [];
  for (const chat of [...state.chats].sort((a, b) => a.updated - b.updated)) {
    for (const message of chat.messages) {
      message.images?.forEach((url, index) => {
        if (url) held.push({ message, index, size: url.length });
      });
    }
  }
  let total = held.reduce((sum, p) => sum + p.size, 0);
  const newest = state.current?.messages.findLast((m) => m.role === "user");
  let dropped = 0;
  for (const picture of held) {
    if (total <= PICTURE_STORE_CAP) break;
    if (picture.message === newest) continue;
    picture.message.images[picture.index] = null;
    total -= picture.size;
    dropped += 1;
  }
  return dropped;
}

function status(text, isError = false) {
  const bar = $("#status");
  bar.textContent = text;
  bar.classList.toggle("error", isError);
}

// ------------------------------------------------------------------ figures
// While a reply streams, its figures on the page's clock, defined as the engine defines them
// (backends/metrics.py RequestStats): TTFT from sending to the first piece; tok/s over the
// pieces after the first, from the first to the last (not to now: a pause between pieces
// does not read as a slower model). The engine's own `timings` replace them at the end.
export function liveFigures(sent, first, last, pieces) {
  const decode = pieces > 1 && last > first ? (pieces - 1) / ((last - first) / 1000) : null;
  return { ttft_ms: first == null ? null : first - sent, decode_tps: decode };
}

export function figuresText(f) {
  if (!f) return "";
  const parts = [];
  if (f.ttft_ms != null) parts.push(`TTFT ${Math.round(f.ttft_ms).toLocaleString()} ms`);
  if (f.decode_tps) parts.push(`${f.decode_tps.toFixed(1)} tok/s`);
  if (f.prompt_n != null) {
    parts.push(`prompt ${f.prompt_n} tok` + (f.cached_n ? ` (${f.cached_n} cached)` : "") +
               (f.prefill_tps ? ` @ ${f.prefill_tps.toFixed(1)} tok/s` : ""));
  }
  if (f.predicted_n != null) {
    parts.push(`${f.predicted_n} tok` + (f.reasoning_n ? ` (${f.reasoning_n} reasoning)` : ""));
  }
  if (f.finish_reason && f.finish_reason !== "stop") parts.push(f.finish_reason);
  return parts.join(" · ");
}

// ------------------------------------------------------------------ rendering
// A reply is text from a model, which may repeat what a web page or a document told it:
// no forms or inputs, no inline styles (the page's policy blocks remote images too).
const SANITIZE = { FORBID_TAGS: ["form", "input", "button", "textarea", "select", "style"],
                   FORBID_ATTR: ["style"] };

function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(text), SANITIZE);
}

function messageElement(message) {
  const box = document.createElement("div");
  box.className = `message ${message.role}`;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = message.role === "user" ? "You" : `Assistant${message.model ? ` · ${message.model}` : ""}`;
  const content = document.createElement("div");
  content.className = "content";
  if (message.role === "user") content.textContent = message.content;
  else content.innerHTML = renderMarkdown(message.content);
  const pictures = document.createElement("div");
  pictures.className = "pictures";
  for (const url of message.images || []) {
    if (isPicture(url)) {
      const image = document.createElement("img");
      image.src = url;
      image.alt = "attached picture";
      pictures.append(image);
    } else {
      const gone = document.createElement("span");
      gone.className = "gone";
      gone.textContent = "picture not kept in this browser";
      pictures.append(gone);
    }
  }
  pictures.hidden = !message.images?.length;
  const figures = document.createElement("div");
  figures.className = "figures";
  figures.textContent = figuresText(message.figures);
  // a thinking model's reasoning: a folded block of its own, shown as plain text
  const reasoning = document.createElement("details");
  reasoning.className = "reasoning";
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const thought = document.createElement("div");
  thought.className = "thought";
  thought.textContent = message.reasoning || "";
  reasoning.append(summary, thought);
  reasoning.hidden = !message.reasoning;
  box.append(who, reasoning, pictures, content, figures);
  return box;
}

function showReasoning(box, text, thinking) {
  const block = box.querySelector(".reasoning");
  block.hidden = !text;
  block.open = thinking;
  block.querySelector("summary").textContent = thinking ? "Thinking…" : "Reasoning";
  block.querySelector(".thought").textContent = text;
}

function showConversation() {
  const list = $("#messages");
  list.replaceChildren();
  const chat = state.current;
  if (!chat || chat.messages.length === 0) {
    const welcome = document.createElement("p");
    welcome.id = "welcome";
    welcome.textContent = "Type a message and press Enter (Shift+Enter for a new line).";
    list.append(welcome);
  } else {
    for (const message of chat.messages) list.append(messageElement(message));
  }
  list.scrollTop = list.scrollHeight;
  showChatList();
}

function showChatList() {
  const list = $("#chats");
  list.replaceChildren();
  for (const chat of [...state.chats].sort((a, b) => b.updated - a.updated)) {
    const item = document.createElement("li");
    if (chat === state.current) item.classList.add("current");
    const link = document.createElement("a");
    link.textContent = chat.title;
    link.title = `${chat.title} (${chat.model})`;
    link.addEventListener("click", () => openChat(chat));
    const rename = document.createElement("button");
    rename.textContent = "✎";
    rename.title = "Rename this conversation";
    rename.addEventListener("click", () => renameChat(chat));
    const remove = document.createElement("button");
    remove.textContent = "×";
    remove.title = "Delete this conversation";
    remove.addEventListener("click", () => deleteChat(chat));
    item.append(link, rename, remove);
    list.append(item);
  }
}

function openChat(chat) {
  if (state.controller) return;
  state.current = chat;
  if (chat.model && chat.model !== state.model) chooseModel(chat.model);
  showConversation();
}

function deleteChat(chat) {
  if (!confirm(`Delete “${chat.title}”?`)) return;
  state.chats = state.chats.filter((c) => c !== chat);
  if (state.current === chat) state.current = null;
  saveChats();
  showConversation();
}

function renameChat(chat) {
  const title = prompt("Rename the conversation", chat.title)?.replace(/\s+/g, " ").trim();
  if (!title) return;  // cancelled, or nothing typed: the old title stays
  chat.title = title;
  saveChats();
  showChatList();
}

// The conversation as Markdown, as the terminal chat app exports it: each reply names the
// model that wrote it when more than one did.
function chatMarkdown(chat) {
  const writers = [...new Set(chat.messages.filter((m) => m.role === "assistant")
    .map((m) => m.model || chat.model))];
  if (!writers.length) writers.push(chat.model);
  const lines = [`# ${chat.title}`, "",
    `Model${writers.length > 1 ? "s" : ""}: ${writers.map((m) => `\`${m}\``).join(", ")}`];
  if (chat.system) lines.push("", "**System:**", "", chat.system);
  for (const message of chat.messages) {
    let heading = message.role === "user" ? "You" : "Assistant";
    if (message.role === "assistant" && writers.length > 1) heading += ` (${message.model || chat.model})`;
    lines.push("", `## ${heading}`, "");
    if (message.images?.length) {
      lines.push(`*(${message.images.length} picture${message.images.length > 1 ? "s" : ""} attached)*`, "");
    }
    lines.push(message.content);
  }
  return lines.join("\n") + "\n";
}

function exportChat() {
  const chat = state.current;
  if (!chat) return status("Nothing to export yet: start a conversation first.", true);
  const file = new Blob([chatMarkdown(chat)], { type: "text/markdown" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(file);
  link.download = `${chat.title.replace(/[\\/:*?"<>|]+/g, "-").slice(0, 60) || "conversation"}.md`;
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);  // once the download has it
}

function newChat() {
  if (state.controller) return;
  state.current = null;
  showConversation();
  $("#prompt").focus();
}

// ------------------------------------------------------------------ models
async function refreshModels() {
  const response = await fetch("/localinfer/models", { headers: headers() });
  if (!response.ok) {
    status(await errorText(response), true);
    return;
  }
  const body = await response.json();
  state.models = body.models;
  const select = $("#model");
  select.replaceChildren();
  const installed = document.createElement("optgroup");
  installed.label = "On this machine";
  const available = document.createElement("optgroup");
  available.label = "To pull";
  for (const row of body.models) {
    const option = document.createElement("option");
    option.value = row.name;
    option.textContent = `${row.name} — ${row.fit}${row.quant ? ` · ${row.quant}` : ""}`;
    (row.installed ? installed : available).append(option);
  }
  select.append(installed, available);
  state.model = state.model || state.current?.model || body.loaded[0] || body.default;
  select.value = state.model;
  showFit();
  await checkVision(state.model);
}

function showFit() {
  const row = state.models.find((r) => r.name === state.model);
  const badge = $("#fit");
  badge.textContent = row ? row.fit : "";
  badge.title = row ? row.detail : "";
  badge.className = `badge ${row ? row.fit.replace(/[^A-Za-z]+/g, "-") : ""}`;
  $("#remove-model").hidden = !(row && row.installed && !row.embedded);
}

async function removeModel() {
  const name = state.model;
  if (state.controller || !confirm(`Delete ${name} from this machine? Pulling it again downloads it again.`)) return;
  const response = await fetch("/api/delete", {
    method: "DELETE", headers: headers(), body: JSON.stringify({ model: name }),
  });
  if (!response.ok) return status(await errorText(response), true);
  if (state.current?.model === name) state.current.model = null;
  state.model = null;
  await refreshModels();  // the server's default, or a model still loaded
  status(`${name} deleted`);
  if (state.current) {
    state.current.model = state.model;
    saveChats();
  }
}

async function chooseModel(name) {
  const row = state.models.find((r) => r.name === name);
  const previous = state.model;
  state.model = name;
  $("#model").value = name;
  showFit();
  showVision(null);
  if (row && !row.installed && !(await pull(name))) {
    state.model = previous;
    $("#model").value = previous;
    showFit();
    checkVision(previous);
    return;
  }
  if (state.current) {
    state.current.model = name;
    saveChats();
  }
  checkVision(name);
  status(`loading ${name} …`);
  const response = await fetch("/api/generate", {
    method: "POST", headers: headers(), body: JSON.stringify({ model: name, prompt: "", stream: false }),
  });
  status(response.ok ? `${name} ready` : await errorText(response), !response.ok);
}

async function pull(name) {
  const bar = $("#pull-progress");
  bar.hidden = false;
  bar.removeAttribute("value");
  status(`pulling ${name} …`);
  try {
    const response = await fetch("/api/pull", {
      method: "POST", headers: headers(), body: JSON.stringify({ model: name, stream: true }),
    });
    if (!response.ok) throw new Error(await errorText(response));
    for await (const line of lines(response, "\n")) {
      if (!line.trim()) continue;
      const update = JSON.parse(line);
      if (update.error) throw new Error(update.error);
      if (update.total) {
        bar.max = update.total;
        bar.value = update.completed;
        status(`pulling ${name}: ${(update.completed / 2 ** 20).toFixed(0)} of ${(update.total / 2 ** 20).toFixed(0)} MiB`);
      }
    }
    await refreshModels();
    return true;
  } catch (error) {
    status(`${name} was not pulled: ${error.message}`, true);
    return false;
  } finally {
    bar.hidden = true;
  }
}

// Text pieces of a streamed body, split on `separator`.
async function* lines(response, separator) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const parts = buffer.split(separator);
    buffer = parts.pop();
    yield* parts;
  }
  if (buffer) yield buffer;
}

// ------------------------------------------------------------------ chatting
function messagesForModel(chat) {
  // earlier reasoning goes back too: each model's template decides whether it is written
  const turns = chat.messages.map((message) => {
    const { role, content, reasoning } = message;
    // a turn's pictures: as sent on this page, or as kept in this browser (thumbnails)
    const pictures = (sentPictures.get(message) || message.images || []).filter(isPicture);
    if (pictures.length) {
      const parts = pictures.map((url) => ({ type: "image_url", image_url: { url } }));
      return { role, content: content ? [...parts, { type: "text", text: content }] : parts };
    }
    return reasoning ? { role, content, reasoning_content: reasoning } : { role, content };
  });
  return chat.system ? [{ role: "system", content: chat.system }, ...turns] : turns;
}

// The message starts its reply; false where it cannot go (the prompt keeps it).
function send(text, pictures) {
  if (!state.model) {
    status("Pick a model first.", true);
    return false;
  }
  if (pictures.length && state.vision === false) {
    status(`${state.model} takes no pictures — remove them, or pick a vision model.`, true);
    return false;
  }
  if (!state.current) {
    state.current = {
      id: crypto.randomUUID ? crypto.randomUUID() : String(Date.now()),
      title: text.replace(/\s+/g, " ").slice(0, 48) || "Picture", model: state.model,
      system: "", params: {}, messages: [], updated: Date.now(),
    };
    state.chats.push(state.current);
  }
  const chat = state.current;
  const question = { role: "user", content: text };
  if (pictures.length) {
    question.images = pictures.map((p) => p.thumb);
    sentPictures.set(question, pictures.map((p) => p.send));
  }
  chat.messages.push(question);
  chat.updated = Date.now();
  saveChats();
  showConversation();
  reply(chat);
  return true;
}

async function reply(chat) {
  const answer = { role: "assistant", content: "", reasoning: "", model: state.model,
                   figures: null };
  const box = messageElement(answer);
  $("#messages").append(box);
  const content = box.querySelector(".content");
  const figures = box.querySelector(".figures");
  state.controller = new AbortController();
  $("#send").hidden = true;
  $("#stop").hidden = false;
  const sent = performance.now();
  let first = null;
  let last = null;
  let pieces = 0;
  let drawing = false;
  let finished = false;  // a frame asked for before the end must not draw over the final figures
  const draw = () => {
    drawing = false;
    if (finished) return;
    content.innerHTML = renderMarkdown(answer.content);
    if (answer.reasoning) showReasoning(box, answer.reasoning, !answer.content);
    const live = liveFigures(sent, first, last, pieces);
    figures.textContent = figuresText(live);
    status(`${answer.model} · ${figuresText(live)}`);
    $("#messages").scrollTop = $("#messages").scrollHeight;
  };
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), signal: state.controller.signal,
      body: JSON.stringify({
        model: state.model, messages: messagesForModel(chat), stream: true,
        temperature: chat.params.temperature, max_tokens: chat.params.max_tokens,
      }),
    });
    if (!response.ok) {
      const text = await errorText(response);
      throw new Error(response.status === 413 ? `${text} — send fewer pictures, or raise the ` +
                      "server's max_body_bytes setting" : text);
    }
    for await (const event of lines(response, "\n\n")) {
      const data = event.replace(/^data: /, "");
      if (!data || data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      const choice = chunk.choices?.[0];
      if (choice?.delta?.content || choice?.delta?.reasoning_content) {
        last = performance.now();
        first ??= last;
        pieces += 1;
        answer.content += choice.delta.content || "";
        answer.reasoning += choice.delta.reasoning_content || "";
        if (!drawing) {
          drawing = true;
          requestAnimationFrame(draw);
        }
      }
      if (chunk.timings) answer.figures = { ...chunk.timings, finish_reason: choice?.finish_reason };
    }
  } catch (error) {
    if (error.name !== "AbortError") {
      box.remove();
      const question = chat.messages.pop();  // the question goes back into the prompt
      saveChats();
      showConversation();
      $("#prompt").value = question.content;
      const sent = sentPictures.get(question);  // and its pictures above it
      question.images?.forEach((thumb, i) => {
        if (isPicture(thumb)) state.attachments.push({ name: "picture", thumb, send: sent?.[i] || thumb });
      });
      showAttachments();
      status(`Reply failed: ${error.message}`, true);
      return;
    }
    answer.figures = { ttft_ms: first ? first - sent : null, predicted_n: pieces, finish_reason: "stopped" };
  } finally {
    finished = true;
    state.controller = null;
    $("#send").hidden = false;
    $("#stop").hidden = true;
  }
  content.innerHTML = renderMarkdown(answer.content);
  showReasoning(box, answer.reasoning, false);
  figures.textContent = figuresText(answer.figures);
  status(`${answer.model} · ${figuresText(answer.figures)}${state.note ? ` — ${state.note}` : ""}`);
  state.note = "";
  if (!answer.reasoning) delete answer.reasoning;
  chat.messages.push(answer);
  chat.updated = Date.now();
  saveChats();
  showChatList();
}

// ------------------------------------------------------------------ settings
function openSettings() {
  const chat = state.current;
  $("#system").value = chat?.system || "";
  $("#temperature").value = chat?.params.temperature ?? "";
  $("#max-tokens").value = chat?.params.max_tokens ?? "";
  $("#settings-error").textContent = chat ? "" : "Settings belong to a conversation: send a first message.";
  $("#settings").showModal();
}

function saveSettings(event) {
  const chat = state.current;
  if (!chat) return;
  const temperature = $("#temperature").value, maxTokens = $("#max-tokens").value;
  if (!$("#temperature").checkValidity() || !$("#max-tokens").checkValidity()) {
    event.preventDefault();
    $("#settings-error").textContent = "Temperature is 0 to 2; max tokens a whole number from 1.";
    return;
  }
  chat.system = $("#system").value;
  chat.params = {
    ...(temperature !== "" ? { temperature: Number(temperature) } : {}),
    ...(maxTokens !== "" ? { max_tokens: Number(maxTokens) } : {}),
  };
  saveChats();
}

// ------------------------------------------------------------------ wiring
$("#composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("#prompt").value.trim();
  const pictures = state.attachments;
  if ((!text && !pictures.length) || state.controller) return;
  if (!send(text, pictures)) return;
  $("#prompt").value = "";
  state.attachments = [];
  showAttachments();
});
$("#prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    $("#composer").requestSubmit();
  }
});
$("#stop").addEventListener("click", () => state.controller?.abort());
$("#new-chat").addEventListener("click", newChat);
$("#model").addEventListener("change", (event) => chooseModel(event.target.value));
$("#open-settings").addEventListener("click", openSettings);
$("#export").addEventListener("click", exportChat);
$("#remove-model").addEventListener("click", removeModel);
$("#save-settings").addEventListener("click", saveSettings);
$("#attach").addEventListener("click", () => $("#attach-input").click());
$("#attach-input").addEventListener("change", async (event) => {
  await attach(event.target.files);
  event.target.value = "";  // the same file may be picked again
});
$("#prompt").addEventListener("paste", (event) => {
  const files = [...(event.clipboardData?.files || [])];
  if (files.length) {
    event.preventDefault();
    attach(files);
  }
});
// a file dropped anywhere on the conversation or the prompt is attached; dropped elsewhere,
// it is not opened in place of the page
const dropArea = document.querySelector("main");
const carriesFiles = (event) => [...(event.dataTransfer?.types || [])].includes("Files");
for (const type of ["dragover", "drop"]) {
  window.addEventListener(type, (event) => carriesFiles(event) && event.preventDefault());
}
dropArea.addEventListener("dragover", (event) => {
  if (carriesFiles(event)) dropArea.classList.add("dropping");
});
dropArea.addEventListener("dragleave", (event) => {
  if (!dropArea.contains(event.relatedTarget)) dropArea.classList.remove("dropping");
});
dropArea.addEventListener("drop", (event) => {
  dropArea.classList.remove("dropping");
  if (!carriesFiles(event)) return;
  event.preventDefault();
  attach(event.dataTransfer.files);
});

state.current = [...state.chats].sort((a, b) => b.updated - a.updated)[0] || null;
showConversation();
refreshModels().catch((error) => status(`No answer from the server: ${error.message}`, true));
