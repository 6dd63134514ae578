// The chat page: streams replies from /v1/chat/completions (SSE), stops
// them by closing the request (the server then cancels the generation),
// and polls /info for the model panel and the live counters.
"use strict";

const $ = (id) => document.getElementById(id);
const conversation = [];
let modelName = null;
let controller = null;

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
  const live = info.live;
  $("tps").textContent = live.tokens_per_second.toFixed(1);
  $("hit-rate").textContent = (100 * live.expert_hit_rate).toFixed(1) + "%";
  $("active").textContent = live.active_sequences + " / " + live.queue_depth;
  if (infoShown) return;
  infoShown = true;
  const m = info.info;
  $("model-name").textContent = info.model + " · " + m.family;
  fillList($("model-info"), [
    ["family", m.family],
    ["layers", m.layers + " (" + m.moe_layers + " MoE)"],
    ["hidden", m.hidden_size],
    ["experts", m.experts + ", top-" + m.experts_per_token],
    ["vocabulary", m.vocab_size],
    ["weights", m.quant],
    ["context", m.context_tokens + " tokens"],
    ["dense", bytes(m.dense_bytes)],
    ["experts on disk", bytes(m.expert_bytes)],
    ["expert cache", bytes(m.expert_cache_bytes)],
    ["RAM budget", bytes(m.ram_budget_bytes)],
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

function addMessage(role, text) {
  $("empty")?.remove();
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("messages").append(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

function number(id) {
  const v = $(id).value;
  return v === "" ? undefined : Number(v);
}

async function send(text) {
  conversation.push({ role: "user", content: text });
  addMessage("user", text);
  const bubble = addMessage("assistant streaming", "");
  const body = document.createTextNode("");
  bubble.append(body);
  controller = new AbortController();
  setBusy(true);
  const started = performance.now();
  let firstAt = null;
  let usage = null;
  let finish = null;
  let reply = "";
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      signal: controller.signal,
      body: JSON.stringify({
        model: modelName,
        messages: conversation,
        stream: true,
        stream_options: { include_usage: true },
        temperature: number("temperature"),
        top_p: number("top-p"),
        max_tokens: number("max-tokens"),
        seed: number("seed"),
      }),
    });
    if (!response.ok) {
      const err = await response.json().catch(() => ({}));
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
          const piece = choice.delta && choice.delta.content;
          if (piece) {
            if (firstAt === null) firstAt = performance.now();
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
      bubble.classList.add("error");
      body.textContent = reply + (reply ? "\n" : "") + "Error: " + e.message;
    }
  } finally {
    controller = null;
    setBusy(false);
    bubble.classList.remove("streaming");
  }
  conversation.push({ role: "assistant", content: reply });
  const meta = document.createElement("span");
  meta.className = "meta";
  const seconds = (performance.now() - (firstAt ?? started)) / 1000;
  const parts = [];
  if (usage) {
    parts.push(usage.completion_tokens + " tokens");
    if (seconds > 0) parts.push((usage.completion_tokens / seconds).toFixed(1) + " tokens/s");
  }
  if (finish) parts.push(finish);
  if (bubble.classList.contains("error")) parts.push("failed");
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
  $("messages").replaceChildren();
});

$("api-key").value = apiKey();
$("api-key").addEventListener("change", () => {
  localStorage.setItem("strata-api-key", $("api-key").value);
  infoShown = false;
  refreshInfo();
});

refreshInfo();
setInterval(refreshInfo, 1000);
