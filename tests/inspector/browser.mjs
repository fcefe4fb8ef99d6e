// Drives the inspector page in headless Chromium (tests/inspector.rs):
//   node browser.mjs URL CREDENTIAL QUESTION SCREENSHOT_PREFIX
// env: PERPETUITY_BROWSER_NPM (the npm prefix holding playwright-core), PERPETUITY_CHROMIUM.
// Opens the page, signs in with CREDENTIAL (kept in the page script's memory), waits for the
// user's turns, asks QUESTION's frame, saves screenshots, and prints one JSON line: the turns'
// and the frame's texts as the page shows them, and every sign that stored text ran as code
// (a CSP violation, a console error, a page error, a dialog, a request to a canary URL,
// window.__pwned set, elements injected into the views). Exits 1 when there is any.
import { createRequire } from "node:module";

const { chromium } = createRequire(`${process.env.PERPETUITY_BROWSER_NPM}/node_modules/`)("playwright-core");
const [url, credential, question, shots] = process.argv.slice(2);
const problems = [];
const browser = await chromium.launch({ executablePath: process.env.PERPETUITY_CHROMIUM, args: ["--disable-gpu"] });
try {
  const page = await browser.newPage({ viewport: { width: 1100, height: 800 }, deviceScaleFactor: 1 });
  page.on("console", (m) => m.type() === "error" && problems.push(`console: ${m.text()}`));
  page.on("pageerror", (e) => problems.push(`pageerror: ${e.message}`));
  page.on("dialog", (d) => { problems.push(`dialog: ${d.message()}`); d.dismiss(); });
  page.on("request", (r) => /pwned/.test(r.url()) && problems.push(`request: ${r.url()}`));
  await page.exposeFunction("__violation", (s) => problems.push(`csp: ${s}`));
  await page.addInitScript(() => document.addEventListener("securitypolicyviolation",
    (e) => window.__violation(`${e.violatedDirective} ${e.blockedURI}`)));
  const loaded = await page.goto(url);
  if (!loaded.ok()) throw new Error(`GET ${url}: ${loaded.status()}`);
  await page.fill("#secret", credential);
  await page.click("#login button[type=submit]");
  await page.locator("#turns li").first().waitFor({ timeout: 10_000 });
  const turns = await page.locator("#turns .text").allTextContents();
  await page.screenshot({ path: `${shots}-turns.png`, fullPage: false });
  await page.fill("#question", question);
  await page.click("#ask button[type=submit]");
  await page.locator("#frame .message").first().waitFor({ timeout: 10_000 });
  const frame = await page.locator("#frame .content").allTextContents();
  await page.screenshot({ path: `${shots}-frame.png`, fullPage: false });
  await page.waitForTimeout(300); // let a broken image's error handler and any report land
  const injected = await page.locator("#turns :is(script, img, svg, iframe, object, embed), #frame :is(script, img, svg, iframe, object, embed)").count();
  if (injected) problems.push(`${injected} element(s) made from stored text`);
  const pwned = await page.evaluate(() => window.__pwned);
  if (pwned !== undefined) problems.push(`window.__pwned = ${pwned}`);
  const stored = await page.evaluate(() => JSON.stringify(Object.assign({}, sessionStorage, localStorage)));
  if (stored !== "{}") problems.push(`storage holds ${stored}`);
  if (page.url().includes(credential)) problems.push("the credential is in the URL");
  console.log(JSON.stringify({ turns, frame, problems }));
} finally {
  await browser.close();
}
process.exit(problems.length ? 1 : 0);
