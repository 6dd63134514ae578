// Drives the chat page of a running `serve` in headless Chromium, as a
// person would: waits for the model panel, types a message, watches the
// answer stream in, stops a long reply, and takes a screenshot.
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
    page.on("console", (m) => m.type() === "error" && problems.push("console: " + m.text()));
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
