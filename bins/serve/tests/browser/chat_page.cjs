// Drives the chat page of a running `serve` in headless Chromium, as a
// person would: waits for the model panel, types a message, watches the
// answer stream in, stops a long reply, goes on for twenty exchanges (far
// past the demo model's 256-token context) and one message too long to
// answer, reloads (the conversation stays), shows a reasoning reply's
// thinking apart from its answer, and takes a screenshot.
//
// Usage: node chat_page.cjs URL SCREENSHOT.png
// Env: PLAYWRIGHT_CORE (the installed playwright-core), CHROMIUM (the browser).
"use strict";

const { chromium } = require(process.env.PLAYWRIGHT_CORE || "playwright-core");

function check(condition, message) {
  if (!condition) throw new Error("check failed: " + message);
}

async function main() {
  const [url, screenshot] = process.argv.slice(2);
  const origin = new URL(url).origin;
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    // Root in CI has no sandbox; the rest keeps Chromium off the network
    // (the page must work offline, with nothing but this server).
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1200, height: 760 } });
    const problems = [];
    page.on("pageerror", (e) => problems.push("page error: " + e.message));
    // Chromium logs every 4xx response as a console error; the page meets
    // those on purpose (a context overflow it then fits, a message too long).
    let refused = 0;
    page.on("console", (m) => {
      if (m.type() !== "error") return;
      if (/status of 400/.test(m.text())) refused++;
      else problems.push("console: " + m.text());
    });
    const sent = [];
    page.on("request", (r) => {
      if (r.url().endsWith("/v1/chat/completions")) sent.push(JSON.parse(r.postData()));
    });
    page.on("request", (r) => {
      if (!r.url().startsWith(origin)) problems.push("request outside the server: " + r.url());
    });

    await page.goto(url);
    // The model panel and the live counters come from /info.
    await page.waitForFunction(() => document.querySelectorAll("#model-info dd").length > 5, null, { timeout: 15000 });
    const family = await page.textContent("#model-info dd");
    console.log("model panel: family " + family);

    // Record the lengths the reply's text goes through while it streams.
    await page.evaluate(() => {
      window.__lengths = new Set();
      new MutationObserver(() => {
        const text = document.querySelector(".msg.assistant")?.childNodes[0];
        if (text && text.textContent.length > 0) window.__lengths.add(text.textContent.length);
      }).observe(document.getElementById("messages"), {
        subtree: true,
        characterData: true,
        childList: true,
      });
    });
    // A slow network (DevTools throttling) so that the reply arrives over a
    // second or so and the page must show it as it comes; the server alone
    // is fast enough to finish a short reply within one network read.
    const cdp = await page.context().newCDPSession(page);
    await cdp.send("Network.enable");
    await cdp.send("Network.emulateNetworkConditions", {
      offline: false,
      latency: 0,
      downloadThroughput: 12 * 1024,
      uploadThroughput: -1,
    });
    await page.fill("#seed", "5");
    await page.fill("#max-tokens", "40");
    await page.fill("#prompt", "What do you think about computers?");
    await page.press("#prompt", "Enter");
    await page.waitForSelector(".msg.user", { timeout: 5000 });
    await page.waitForSelector(".msg.assistant:not(.streaming)", { timeout: 60000 });
    const reply = await page.$eval(".msg.assistant", (b) => b.childNodes[0].textContent);
    check(!(await page.$(".msg.error")), "no error: " + reply);
    const updates = await page.evaluate(() => window.__lengths.size);
    console.log("reply: " + JSON.stringify(reply) + ", shown in " + updates + " steps");
    check(reply.length > 0, "a reply");
    check(updates >= 2, "the reply streamed in pieces (" + updates + " steps)");
    check(/tokens/.test(await page.textContent(".msg.assistant .meta")), "token count shown");

    // A long greedy reply (the demo model loops on this one), stopped as it
    // streams (still on the slow network, so the page is surely mid-reply):
    // the click comes from inside the page the moment the first words show.
    await page.fill("#temperature", "0");
    await page.fill("#max-tokens", "150"); // the conversation so far and this fit in 256
    await page.evaluate(() => {
      window.__stop = null;
      const observer = new MutationObserver(() => {
        const replies = document.querySelectorAll(".msg.assistant");
        const text = replies.length === 2 ? replies[1].childNodes[0] : null;
        if (text && text.textContent.length > 0 && window.__stop === null) {
          const stop = document.getElementById("stop");
          window.__stop = { enabled: !stop.disabled, shown: text.textContent.length };
          stop.click();
          observer.disconnect();
        }
      });
      observer.observe(document.getElementById("messages"), { subtree: true, characterData: true, childList: true });
    });
    await page.fill("#prompt", "Give me a quote by Mark Twain.");
    await page.press("#prompt", "Enter");
    await page.waitForSelector(".msg.assistant ~ .msg.assistant .meta", { timeout: 60000 });
    const stop = await page.evaluate(() => window.__stop);
    const meta = await page.$$eval(".msg.assistant .meta", (m) => m[m.length - 1].textContent);
    console.log("stopped reply: " + meta + " after " + stop.shown + " characters");
    check(stop.enabled, "stop is enabled while streaming");
    check(/stopped/.test(meta), "the stop button stopped the reply (" + meta + ")");
    check(await page.$eval("#stop", (b) => b.disabled), "stop is disabled when idle");
    check(!(await page.$eval("#send", (b) => b.disabled)), "send is enabled when idle");

    // Live counters: the next /info poll shows the work done.
    await page.waitForFunction(() => /%$/.test(document.getElementById("hit-rate").textContent), null, {
      timeout: 5000,
    });
    const tps = await page.textContent("#tps");
    const hits = await page.textContent("#hit-rate");
    console.log("live: " + tps + " tokens/s, " + hits + " expert hits");
    check(!isNaN(parseFloat(tps)), "tokens/s shown");
    const memory = await page.textContent("#memory-info");
    console.log("memory panel: " + memory);
    check(/resident[\d.]+ (KiB|MiB|GiB)/.test(memory), "resident memory shown: " + memory);
    check(/expert cache[\d.]+ (B|KiB|MiB|GiB) of /.test(memory), "expert cache use of capacity shown: " + memory);

    // Twenty exchanges more, without throttling, half with "max tokens 200":
    // the page must leave out old turns (and say so) rather than dead-end.
    await cdp.send("Network.emulateNetworkConditions", {
      offline: false,
      latency: 0,
      downloadThroughput: -1,
      uploadThroughput: -1,
    });
    await page.fill("#temperature", "0.8");
    await page.fill("#seed", "");
    const questions = [
      "Tell me a fortune.",
      "What did Mark Twain say about money?",
      "Can you explain how a Mixture-of-Experts model works?",
      "Give me a quote about computers.",
      "What is the meaning of life?",
    ];
    const replies = () => page.$$eval(".msg.assistant .meta", (m) => m.length);
    const lastReply = () =>
      page.$$eval(".msg.assistant", (b) => {
        const x = b[b.length - 1];
        return {
          error: x.classList.contains("error"),
          text: x.childNodes[0].textContent,
          meta: x.querySelector(".meta").textContent,
        };
      });
    async function exchange(text, maxTokens) {
      await page.fill("#max-tokens", maxTokens);
      const before = await replies();
      await page.fill("#prompt", text);
      await page.press("#prompt", "Enter");
      await page.waitForFunction((n) => document.querySelectorAll(".msg.assistant .meta").length > n, before, {
        timeout: 60000,
      });
      return lastReply();
    }
    const started = Date.now();
    let longest = 0;
    for (let i = 0; i < 20; i++) {
      const question = questions[i % questions.length];
      const reply = await exchange(question, i < 10 ? "" : "200");
      check(!reply.error, "exchange " + (i + 1) + " failed: " + reply.text);
      const body = sent[sent.length - 1];
      check(body.messages[body.messages.length - 1].content === question, "the last message sent is the question");
      longest = Math.max(longest, body.messages.length);
      if (i === 9) {
        // A message too long for the context even alone: it fails, and is
        // not kept: the next request does not carry it.
        const long = "Tell me more about this, please. ".repeat(60);
        const failed = await exchange(long, "");
        check(failed.error && /not kept/.test(failed.meta), "a too-long message fails and is dropped: " + failed.meta);
        const next = await exchange(questions[0], "");
        check(!next.error, "the exchange after a failed one works: " + next.text);
        const body = sent[sent.length - 1];
        check(!body.messages.some((m) => m.content === long), "the failed message is not sent again");
      }
    }
    const seconds = (Date.now() - started) / 1000;
    const notices = await page.$$eval(".msg.notice", (n) => n.length);
    const greyed = await page.$$eval(".msg.dropped", (n) => n.length);
    console.log(
      "20 exchanges (and a failed one) in " + seconds.toFixed(1) + " s; " + greyed + " messages left out; " +
        "at most " + longest + " messages sent; " + refused + " requests refused",
    );
    check(notices === 1 && greyed > 0, "the page said that it left out old turns, and greyed them");

    // A reload shows the conversation the model is sent (greyed turns and
    // failed ones are not part of it), and the next question carries it.
    const kept = await page.evaluate(() => JSON.parse(localStorage.getItem("strata-conversation") || "[]"));
    const lastText = (await lastReply()).text;
    await page.reload();
    await page.waitForFunction(() => document.querySelectorAll("#model-info dd").length > 5, null, { timeout: 15000 });
    const shown = await page.$$eval(".msg.user, .msg.assistant", (b) => b.map((x) => x.textContent));
    console.log("after a reload: " + shown.length + " messages of " + kept.length + " kept");
    check(kept.length > 0 && shown.length === kept.length, "the kept conversation is shown after a reload");
    check(shown[shown.length - 1] === lastText, "the last reply is shown after a reload");
    // Idle now: nothing decoding, nothing queued.
    await page.waitForFunction(() => document.getElementById("active").textContent === "0 / 0", null, {
      timeout: 5000,
    });
    const after = await exchange(questions[1], "");
    check(!after.error, "the exchange after a reload works: " + after.text);
    // The page kept its estimate of tokens per character with the
    // conversation, so it leaves out no more than it would have before the
    // reload: at least the last exchange goes with the question, in order.
    const resent = sent[sent.length - 1].messages;
    const carried = resent.slice(0, -1).map((m) => m.content);
    const keptTail = kept.slice(kept.length - carried.length).map((m) => m.content);
    console.log("after a reload the question carried " + carried.length + " of " + kept.length + " kept messages");
    check(
      carried.length >= 2 && carried.every((c, i) => c === keptTail[i]),
      "the question after a reload carries the kept conversation's latest turns",
    );

    // A reasoning model's reply (the demo does not think, so the stream is
    // the server's shape, played back): the thinking is shown apart,
    // dimmed, folded once the answer comes, and not sent back as the answer.
    const thought = "The user wants a fortune. A short one will do.";
    const answer = "You will find what you are looking for.";
    const chunk = (delta, extra) =>
      "data: " + JSON.stringify({ object: "chat.completion.chunk", choices: [{ index: 0, delta, ...extra }] }) + "\n\n";
    const stream =
      chunk({ role: "assistant" }) +
      chunk({ reasoning_content: thought.slice(0, 20) }) +
      chunk({ reasoning_content: thought.slice(20) }) +
      chunk({ content: answer }) +
      chunk({}, { finish_reason: "stop" }) +
      "data: [DONE]\n\n";
    await page.route(
      "**/v1/chat/completions",
      (route) => route.fulfill({ status: 200, contentType: "text/event-stream", body: stream }),
      { times: 1 },
    );
    const thinking = await exchange("Tell me a fortune, and think first.", "");
    check(!thinking.error, "the reasoning reply shows: " + thinking.text);
    const shownApart = await page.$$eval(".msg.assistant", (b) => {
      const bubble = b[b.length - 1];
      const details = bubble.querySelector("details.thinking");
      const answerText = [...bubble.childNodes].filter((n) => n.nodeType === Node.TEXT_NODE).map((n) => n.textContent);
      return details && {
        thinking: details.querySelector("div").textContent,
        open: details.open,
        dimmed: getComputedStyle(details).color !== getComputedStyle(bubble).color,
        answer: answerText.join(""),
      };
    });
    console.log("reasoning reply: " + JSON.stringify(shownApart));
    check(shownApart && shownApart.thinking === thought, "the thinking is shown apart from the answer");
    check(shownApart.answer === answer, "the answer holds no thinking");
    check(shownApart.dimmed && !shownApart.open, "the thinking is dimmed and folded");
    const followUp = await exchange(questions[2], "");
    check(!followUp.error, "the exchange after a reasoning reply works: " + followUp.text);
    const history = sent[sent.length - 1].messages;
    const previous = history[history.length - 2];
    check(
      previous.role === "assistant" && previous.content === answer,
      "the reasoning reply goes back as its answer alone: " + JSON.stringify(previous),
    );

    await page.screenshot({ path: screenshot, fullPage: true });
    check(problems.length === 0, problems.join("\n"));
    console.log("ok");
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(e.stack || String(e));
  process.exit(1);
});
