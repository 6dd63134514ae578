// The chat page: streams replies from /v1/chat/completions (SSE), stops
// them by closing the request (the server then cancels the generation),
// and polls /info for the model panel and the live counters.
//
// The conversation is fitted to the model's context as a person expects:
// the oldest turns are left out (never a system message or the message
// just sent), the page says so and greys them, and a turn that failed is
// not kept. What the model is sent is kept in the browser's storage, so a
// reload shows it again (as llama-server's page does).
"use strict";

const $ = (id) => document.getElementById(id);
// What the model is sent: { role, content, bubble } in order.
const conversation = [];
let modelName = null;
let controller = null;
let contextTokens = null;
// Prompt tokens per character sent, learned from each reply's usage; a
// cautious guess until the first one. Each message counts MARKUP_CHARS more
// for what the chat template wraps it in. Kept beside the conversation: a
// reload that forgot it would fit the kept turns by the guess, and leave out
// turns that fit.
let tokensPerChar = 0.5;
const MARKUP_CHARS = 16;
// The share of the context kept for the answer when no max tokens is set.
const ANSWER_SHARE = 0.25;
const CONVERSATION_KEY = "strata-conversation";
const TOKENS_PER_CHAR_KEY = "strata-tokens-per-char";

function apiKey() {
  return localStorage.getItem("strata-api-key") || "";
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function bytes(n) {
  if (!n) return "0 B";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function fillList(dl, rows) {
  dl.replaceChildren();
  for (const [name, value] of rows) {
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dl.append(dt, dd);
  }
}

let infoShown = false;
async function refreshInfo() {
  let response;
  try {
    response = await fetch("/info", { headers: headers() });
  } catch (e) {
    return;
  }
  if (response.status === 401) {
    $("key-row").classList.add("needed");
    $("model-name").textContent = "API key needed";
    return;
  }
  if (!response.ok) return;
  const info = await response.json();
  modelName = info.model;
  contextTokens = info.limits.context_tokens;
  const live = info.live;
  $("tps").textContent = live.tokens_per_second.toFixed(1);
  $("hit-rate").textContent = (100 * live.expert_hit_rate).toFixed(1) + "%";
  $("active").textContent = live.active_sequences + " / " + live.queue_depth;
  const m = info.info;
  // In use now, beside the capacities the memory budget planned.
  fillList($("memory-info"), [
    ["resident", live.resident_bytes == null ? "unknown" : bytes(live.resident_bytes)],
    ["expert cache", bytes(live.expert_cache_used_bytes) + " of " + bytes(m.expert_cache_bytes)],
    ["KV cache", bytes(live.kv_bytes)],
    ["RAM budget", bytes(m.ram_budget_bytes)],
  ]);
  if (infoShown) return;
  infoShown = true;
  if (info.model === "demo" && $("empty")) {
    $("empty").textContent =
      "This is the built-in demo model: 14.7 M parameters trained on fortune cookies. It writes " +
      "fortune-like English and does not follow instructions. For a real model: strata pull ORG/NAME, " +
      "then serve --model ORG/NAME.";
  }
  $("model-name").textContent = info.model + " · " + m.family;
  fillList($("model-info"), [
    ["family", m.family],
    ["layers", m.layers + " (" + m.moe_layers + " MoE)"],
    ["hidden", m.hidden_size],
    ["experts", m.experts + ", top-" + m.experts_per_token],
    ["vocabulary", m.vocab_size],
    ["weights", m.quant],
    ["activations", m.activations === "q8" ? "q8 (lossy)" : m.activations],
    ["context", m.context_tokens + " tokens"],
    ["dense", bytes(m.dense_bytes)],
    ["experts on disk", bytes(m.expert_bytes)],
  ]);
  fillList($("server-info"), [
    ["version", info.version],
    ["batch", info.limits.max_batch + " sequences"],
    ["queue", info.limits.queue + " requests"],
    ["max tokens", info.limits.max_tokens],
  ]);
  $("temperature").value = info.defaults.temperature;
  $("top-p").value = info.defaults.top_p;
  // Empty: as many as the context has room for (up to the server's limit).
  $("max-tokens").placeholder = "up to " + info.limits.max_tokens;
}

// Keeps what the model is sent; a full or disabled storage only loses the
// conversation on the next reload.
function saveConversation() {
  try {
    localStorage.setItem(CONVERSATION_KEY, JSON.stringify(conversation.map(({ role, content }) => ({ role, content }))));
    localStorage.setItem(TOKENS_PER_CHAR_KEY, String(tokensPerChar));
  } catch (e) {
    // Nothing to do: the conversation goes on without being kept.
  }
}

// Shows the conversation kept before a reload; what is not a message is
// skipped.
function restoreConversation() {
  let saved;
  try {
    saved = JSON.parse(localStorage.getItem(CONVERSATION_KEY) || "[]");
  } catch (e) {
    return;
  }
  if (!Array.isArray(saved)) return;
  // A stored estimate is used only if it is one this page could have learned.
  const learned = Number(localStorage.getItem(TOKENS_PER_CHAR_KEY));
  if (Number.isFinite(learned) && learned > 0 && learned <= 4) tokensPerChar = learned;
  for (const m of saved) {
    if (!m || typeof m.content !== "string" || !["system", "user", "assistant"].includes(m.role)) continue;
    conversation.push({ role: m.role, content: m.content, bubble: addMessage(m.role, m.content) });
  }
}

function addMessage(role, text) {
  $("empty")?.remove();
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

// A reply's thinking: dimmed, open while it streams, folded once the
// answer begins (a click shows it again). Only the answer is kept in the
// conversation: templates drop earlier turns' thinking anyway.
function addThinking(bubble, body) {
  const details = document.createElement("details");
  details.className = "thinking";
  details.open = true;
  const summary = document.createElement("summary");
  summary.textContent = "Thinking";
  const text = document.createElement("div");
  details.append(summary, text);
  bubble.insertBefore(details, body);
  return { details, text };
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

function number(id) {
  const v = $(id).value;
  return v === "" ? undefined : Number(v);
}

function chars(messages) {
  return messages.reduce((n, m) => n + m.content.length + MARKUP_CHARS, 0);
}

// The index of the oldest turn that may be left out (not a system message,
// not the newest message), or -1.
function oldestDroppable() {
  const i = conversation.findIndex((m) => m.role !== "system");
  return i >= 0 && i < conversation.length - 1 ? i : -1;
}

// Leaves out the oldest turn (with the reply that answered it), greying its
// bubbles; returns whether there was one.
function dropOldest() {
  const i = oldestDroppable();
  if (i < 0) return false;
  let n = 1;
  while (i + n < conversation.length - 1 && conversation[i + n].role === "assistant") n++;
  for (const m of conversation.splice(i, n)) m.bubble?.classList.add("dropped");
  return true;
}

// Leaves out the oldest turns until the conversation, by the learned
// tokens per character, leaves room for `reserve` tokens of answer.
function fitToContext(reserve) {
  let dropped = 0;
  while (contextTokens && chars(conversation) * tokensPerChar + reserve > contextTokens && dropOldest()) dropped++;
  return dropped;
}

// One notice, after the latest exchange: older ones said the same.
function notice(text) {
  for (const old of document.querySelectorAll(".msg.notice")) old.remove();
  addMessage("notice", text);
}

async function send(text) {
  const userBubble = addMessage("user", text);
  const turn = { role: "user", content: text, bubble: userBubble };
  conversation.push(turn);
  const maxTokens = number("max-tokens");
  const reserve = maxTokens ?? Math.floor((contextTokens || 0) * ANSWER_SHARE);
  let dropped = fitToContext(reserve);
  const bubble = addMessage("assistant streaming", "");
  const body = document.createTextNode("");
  bubble.append(body);
  // The model's thinking (`reasoning_content`), shown apart from the answer.
  let thinking = null;
  controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let usage = null;
  let finish = null;
  let reply = "";
  let failed = false;
  let sentChars = 0;
  let askedTokens = maxTokens;
  try {
    let response;
    for (;;) {
      sentChars = chars(conversation);
      response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        signal: controller.signal,
        body: JSON.stringify({
          model: modelName,
          messages: conversation.map(({ role, content }) => ({ role, content })),
          stream: true,
          stream_options: { include_usage: true },
          temperature: number("temperature"),
          top_p: number("top-p"),
          max_tokens: askedTokens,
          seed: number("seed"),
        }),
      });
      if (response.ok) break;
      const err = await response.json().catch(() => ({}));
      const tooLong = err.error && err.error.code === "context_length_exceeded";
      // The estimate was short: leave out one more old turn and ask again;
      // with none left, let the answer have whatever room remains.
      if (tooLong && dropOldest()) {
        dropped++;
        continue;
      }
      if (tooLong && askedTokens !== undefined) {
        askedTokens = undefined;
        continue;
      }
      throw new Error((err.error && err.error.message) || response.statusText);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) usage = chunk.usage;
          const choice = chunk.choices && chunk.choices[0];
          if (!choice) continue;
          if (choice.finish_reason) finish = choice.finish_reason;
          const thought = choice.delta && choice.delta.reasoning_content;
          if (thought) {
            thinking ??= addThinking(bubble, body);
            thinking.text.textContent += thought;
            bubble.scrollIntoView({ block: "end" });
          }
          const piece = choice.delta && choice.delta.content;
          if (piece) {
            // The answer has begun: the thinking folds away.
            if (thinking) thinking.details.open = false;
            reply += piece;
            body.textContent = reply;
            bubble.scrollIntoView({ block: "end" });
          }
        }
      }
    }
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped";
    } else {
      failed = true;
      bubble.classList.add("error");
      body.textContent = reply + (reply ? "\n" : "") + "Error: " + e.message;
    }
  } finally {
    controller = null;
    setBusy(false);
    bubble.classList.remove("streaming");
    if (thinking) thinking.details.open = false;
  }
  if (dropped > 0) {
    const where = contextTokens ? "the model's " + contextTokens + "-token context" : "the model's context";
    notice("The oldest messages (greyed) no longer fit " + where + ": the model does not see them now.");
  }
  if (usage && sentChars > 0) tokensPerChar = usage.prompt_tokens / sentChars;
  if (failed || (finish === "stopped" && !reply)) {
    // Not kept: the next message is sent as if this one had not been.
    conversation.splice(conversation.indexOf(turn), 1);
    userBubble.classList.add("dropped");
  } else {
    conversation.push({ role: "assistant", content: reply, bubble });
  }
  saveConversation();
  const meta = document.createElement("span");
  meta.className = "meta";
  // From the request, not from the first token: a short reply arrives in
  // one or two network reads, and its tokens over the milliseconds between
  // them gave rates several times the model's.
  const seconds = (performance.now() - started) / 1000;
  const parts = [];
  if (usage) {
    parts.push(usage.completion_tokens + " tokens");
    if (seconds > 0) parts.push((usage.completion_tokens / seconds).toFixed(1) + " tokens/s");
  }
  if (finish) parts.push(finish);
  if (failed) parts.push("failed, not kept in the conversation");
  if (askedTokens !== maxTokens) parts.push("max tokens lowered to fit the context");
  meta.textContent = parts.join(" · ");
  bubble.append(meta);
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  $("prompt").value = "";
  send(text);
});

$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});

$("stop").addEventListener("click", () => controller && controller.abort());

$("clear").addEventListener("click", () => {
  if (controller) controller.abort();
  conversation.length = 0;
  saveConversation();
  $("messages").replaceChildren();
});

$("api-key").value = apiKey();
$("api-key").addEventListener("change", () => {
  localStorage.setItem("strata-api-key", $("api-key").value);
  infoShown = false;
  refreshInfo();
});

restoreConversation();
refreshInfo();
setInterval(refreshInfo, 1000);
