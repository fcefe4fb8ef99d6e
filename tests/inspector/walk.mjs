// Walks the inspector in headless Chromium over a served memory (tests/inspector.rs):
//   node walk.mjs URL CREDENTIAL OTHER_CREDENTIAL CONVERSATION QUESTION SCREENSHOT_PREFIX
// env: PERPETUITY_BROWSER_NPM (the npm prefix holding playwright-core), PERPETUITY_CHROMIUM.
// As CREDENTIAL: opens its memory, picks its last request (the body as forwarded, each turn of
// CONVERSATION with its reason against that request), excludes then includes a turn (each
// confirmed in the page), asks QUESTION's frame, searches for it; as OTHER_CREDENTIAL in a
// second browser context, reads its own turns; then purges CREDENTIAL's memory, cancelling the
// first time. Prints one JSON line of what the pages showed, and every sign that stored text
// ran as code (a CSP violation, a console error, a page error, a dialog, a request to a canary
// URL, window.__pwned set, elements made from stored text). Exits 1 when there is any, or when
// a step fails.
import { createRequire } from "node:module";

const { chromium } = createRequire(`${process.env.PERPETUITY_BROWSER_NPM}/node_modules/`)("playwright-core");
const [url, credential, other, conversation, question, shots] = process.argv.slice(2);
const problems = [];
const report = { problems };
const browser = await chromium.launch({ executablePath: process.env.PERPETUITY_CHROMIUM, args: ["--disable-gpu"] });

async function opened(secret) {
  const context = await browser.newContext({ viewport: { width: 1400, height: 900 }, deviceScaleFactor: 1 });
  const page = await context.newPage();
  page.on("console", (m) => m.type() === "error" && problems.push(`console: ${m.text()}`));
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));
  page.on("dialog", (d) => { problems.push(`dialog: ${d.message()}`); d.dismiss(); });
  page.on("request", (r) => /pwned/.test(r.url()) && problems.push(`request: ${r.url()}`));
  await page.exposeFunction("__violation", (s) => problems.push(`csp: ${s}`));
  await page.addInitScript(() => document.addEventListener("securitypolicyviolation",
    (e) => window.__violation(`${e.violatedDirective} ${e.blockedURI}`)));
  const loaded = await page.goto(url);
  if (!loaded.ok()) throw new Error(`GET ${url}: ${loaded.status()}`);
  await page.fill("#secret", secret);
  await page.click("#login button[type=submit]");
  await page.locator("#turns li").first().waitFor({ timeout: 20_000 });
  return page;
}

async function inert(page) {
  await page.waitForTimeout(300); // let a broken image's error handler and any report land
  const injected = await page.locator(":is(#turns, #frame, #found, #request, #requests, #conversations) :is(script, img, svg, iframe, object, embed)").count();
  if (injected) problems.push(`${injected} element(s) made from stored text`);
  const pwned = await page.evaluate(() => window.__pwned);
  if (pwned !== undefined) problems.push(`window.__pwned = ${pwned}`);
  const stored = await page.evaluate(() => JSON.stringify(Object.assign({}, sessionStorage, localStorage)));
  if (stored !== "{}") problems.push(`storage holds ${stored}`);
  if (page.url() !== url) problems.push(`the page moved to ${page.url()}`);
}

// Click `target`, answer the in-page confirmation with `answer` (yes or no); whether it asked.
async function confirmed(page, target, answer) {
  await page.click(target);
  const box = page.locator("#confirm");
  await box.waitFor({ state: "visible", timeout: 5_000 });
  await page.click(answer ? "#confirm-yes" : "#confirm-no");
  await box.waitFor({ state: "hidden", timeout: 5_000 });
  return true;
}

try {
  const page = await opened(credential);
  await page.locator("#requests li button").first().waitFor();
  await page.locator("#conversations li").first().waitFor();
  report.conversations = await page.locator("#conversations button.conversation").allTextContents();
  await page.screenshot({ path: `${shots}-memory.png` });

  // The last request: the body as forwarded, and each turn's reason against it.
  await page.locator("#requests li button").first().click();
  await page.locator("#request .forwarded-body").waitFor({ state: "attached", timeout: 10_000 });
  report.forwarded = await page.locator("#request .forwarded-body").textContent();
  await page.screenshot({ path: `${shots}-request.png` });
  await page.click("#request details.retrieved summary");
  await page.locator(`#conversations li[data-conversation="${conversation}"] button.conversation`).click();
  await page.waitForFunction((wanted) => {
    const items = [...document.querySelectorAll("#turns li")];
    return items.length > 0 && items.every((li) => li.querySelector(".why") &&
      li.querySelector(".meta").textContent.includes(` · ${wanted} · `));
  }, conversation, { timeout: 10_000 });
  report.whys = await page.$$eval("#turns li", (items) => items.map((li) => {
    const why = li.querySelector(".why");
    return { row: Number(li.dataset.row), fate: why.classList[1], reason: why.textContent };
  }));
  await page.locator("#turns-of").scrollIntoViewIfNeeded();
  await page.evaluate(() => window.scrollBy(0, document.getElementById("turns-of").getBoundingClientRect().top - 10));
  await page.screenshot({ path: `${shots}-conversation.png` });

  // Exclude a turn, then include it again, each confirmed in the page first.
  const row = report.whys[0].row;
  const turn = `#turns li[data-row="${row}"]`;
  report.excluded = [await confirmed(page, `${turn} button.exclude`, true)];
  await page.locator(`${turn}.excluded`).waitFor({ timeout: 10_000 });
  report.excluded.push(await page.locator(turn).evaluate((li) => li.classList.contains("excluded")));
  await confirmed(page, `${turn} button.include`, true);
  await page.locator(`${turn}:not(.excluded)`).waitFor({ timeout: 10_000 });
  report.excluded.push(await page.locator(turn).evaluate((li) => li.classList.contains("excluded")));

  // The frame the question would get, and a search.
  await page.fill("#question", question);
  await page.click("#ask button[type=submit]");
  await page.locator("#frame .message").first().waitFor({ timeout: 10_000 });
  report.frame = await page.locator("#frame .content").allTextContents();
  await page.screenshot({ path: `${shots}-frame.png` });
  await page.fill("#query", question);
  await page.click("#search button[type=submit]");
  await page.locator("#found li.turn").first().waitFor({ timeout: 10_000 });
  report.found = await page.locator("#found .text").allTextContents();

  // Another credential sees its own memory only.
  const second = await opened(other);
  report.other = await second.locator("#turns .text").allTextContents();
  await inert(second);
  await inert(page);

  // The purge: asked first and cancelled (nothing changes), then confirmed.
  report.turns_before_purge = await page.locator("#turns li").count();
  await confirmed(page, "#purge", false);
  report.purge_cancelled_turns = await page.locator("#turns li").count();
  await confirmed(page, "#purge", true);
  await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("purged"), null, { timeout: 60_000 });
  report.turns_after_purge = await page.locator("#turns li").count();
} catch (error) {
  problems.push(`step failed: ${error.message}`);
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
process.exit(problems.length ? 1 : 0);
