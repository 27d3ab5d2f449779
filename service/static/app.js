// BayesGate demo page: draw, load or upload a digit; show the service's answer; attack it.
// One plain module, no dependencies. It calls only public routes: /v1/demo, /v1/models,
// /v1/predict/file and (when the server runs with --demo) /v1/attack.
//
// Preprocessing of a drawing (as MNIST's digits were made): the strokes' bounding box is scaled,
// aspect kept, so its longer side is 20 pixels (area averaging), then placed in the 28×28 field so
// that its centre of mass sits at the centre (14, 14). Random test digits are MNIST test images
// sent unchanged; an uploaded 28×28 PNG is sent as it is (converted to grey, inverted when the
// background is light); a larger upload is treated like a drawing.

const SIDE = 28;
const BOX = 20;
const LN10 = Math.log(10);
const FGS_ETAS = Array.from({ length: 21 }, (_, i) => Math.round(i * 25) / 1000); // 0 … 0.5
const $ = (id) => document.getElementById(id);
const SVG_NS = "http://www.w3.org/2000/svg";

const state = {
  config: null, // GET /v1/demo
  model: null, // first entry of GET /v1/models
  pixels: null, // Uint8Array(784): the image last sent
  png: null, // its PNG bytes
  prediction: null,
  attack: null, // last /v1/attack answer (for the η slider)
  requestId: 0,
};

// ---- small helpers ------------------------------------------------------------------------

const fmt = (v, d = 3) => Number(v).toFixed(d);
const pct = (v) => `${(100 * v).toFixed(1)} %`;
const scoreTitle = (name) => name.replaceAll("_", " ");

function status(text) {
  $("status").textContent = text;
}

function svgEl(tag, attrs = {}, text = null) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== null) el.textContent = text;
  return el;
}

function clearSvg(svg) {
  for (const child of [...svg.childNodes]) if (child.nodeName !== "title") child.remove();
}

async function fetchJSON(url, options = {}) {
  const response = await fetch(url, options);
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) {
    const error = new Error(body?.error || `${response.status} ${response.statusText}`);
    error.status = response.status;
    error.retryAfter = Number(response.headers.get("Retry-After") || 0);
    throw error;
  }
  return body;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// ---- PNG: 8-bit grayscale, stored (uncompressed) deflate blocks ----------------------------

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

function adler32(bytes) {
  let a = 1;
  let b = 0;
  for (const x of bytes) {
    a = (a + x) % 65521;
    b = (b + a) % 65521;
  }
  return ((b << 16) | a) >>> 0;
}

function u32(n) {
  return [(n >>> 24) & 255, (n >>> 16) & 255, (n >>> 8) & 255, n & 255];
}

function chunk(type, data) {
  const body = new Uint8Array([...type].map((c) => c.charCodeAt(0)).concat([...data]));
  return [...u32(data.length), ...body, ...u32(crc32(body))];
}

/** A grayscale PNG (mode L) of `pixels` (Uint8Array, row-major) — what /v1/predict/file reads. */
function encodePNG(pixels, width, height) {
  const raw = new Uint8Array(height * (width + 1)); // filter byte 0 before each row
  for (let y = 0; y < height; y++) raw.set(pixels.subarray(y * width, (y + 1) * width), y * (width + 1) + 1);
  const zlib = [0x78, 0x01]; // small images: one stored block is enough (< 65535 bytes)
  zlib.push(1, raw.length & 255, raw.length >>> 8, ~raw.length & 255, (~raw.length >>> 8) & 255);
  zlib.push(...raw, ...u32(adler32(raw)));
  const header = [...u32(width), ...u32(height), 8, 0, 0, 0, 0];
  return new Uint8Array([
    137, 80, 78, 71, 13, 10, 26, 10,
    ...chunk("IHDR", header),
    ...chunk("IDAT", zlib),
    ...chunk("IEND", []),
  ]);
}

function base64(bytes) {
  let text = "";
  for (const b of bytes) text += String.fromCharCode(b);
  return btoa(text);
}

// ---- MNIST-style preprocessing --------------------------------------------------------------

/** 1-D area-averaging weights from `n` source cells onto `m` target cells. */
function areaWeights(n, m) {
  const scale = n / m;
  const out = [];
  for (let t = 0; t < m; t++) {
    const lo = t * scale;
    const hi = (t + 1) * scale;
    const taps = [];
    for (let s = Math.floor(lo); s < Math.min(n, Math.ceil(hi)); s++) {
      const w = Math.min(hi, s + 1) - Math.max(lo, s);
      if (w > 0) taps.push([s, w / scale]);
    }
    out.push(taps);
  }
  return out;
}

/** Resample a `w×h` Float32Array to `tw×th` by area averaging (separable). */
function resampleArea(src, w, h, tw, th) {
  const wx = areaWeights(w, tw);
  const wy = areaWeights(h, th);
  const rows = new Float32Array(tw * h);
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < tw; x++) {
      let v = 0;
      for (const [s, k] of wx[x]) v += src[y * w + s] * k;
      rows[y * tw + x] = v;
    }
  }
  const out = new Float32Array(tw * th);
  for (let y = 0; y < th; y++) {
    for (const [s, k] of wy[y]) for (let x = 0; x < tw; x++) out[y * tw + x] += rows[s * tw + x] * k;
  }
  return out;
}

/** Grey values in [0, 1] of a canvas (white ink on black). */
function greyOf(canvas) {
  const { width, height } = canvas;
  const rgba = canvas.getContext("2d").getImageData(0, 0, width, height).data;
  const grey = new Float32Array(width * height);
  for (let i = 0; i < grey.length; i++) {
    grey[i] = (0.299 * rgba[4 * i] + 0.587 * rgba[4 * i + 1] + 0.114 * rgba[4 * i + 2]) / 255;
  }
  return grey;
}

/** MNIST's recipe: bounding box → 20-pixel box (aspect kept) → centre of mass at (14, 14). */
function mnistPixels(grey, width, height) {
  let x0 = width;
  let y0 = height;
  let x1 = -1;
  let y1 = -1;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      if (grey[y * width + x] > 0.05) {
        x0 = Math.min(x0, x);
        x1 = Math.max(x1, x);
        y0 = Math.min(y0, y);
        y1 = Math.max(y1, y);
      }
    }
  }
  const out = new Uint8Array(SIDE * SIDE);
  if (x1 < 0) return out; // nothing drawn
  const w = x1 - x0 + 1;
  const h = y1 - y0 + 1;
  const crop = new Float32Array(w * h);
  for (let y = 0; y < h; y++) crop.set(grey.subarray((y0 + y) * width + x0, (y0 + y) * width + x0 + w), y * w);
  const scale = BOX / Math.max(w, h);
  const tw = Math.max(1, Math.round(w * scale));
  const th = Math.max(1, Math.round(h * scale));
  const box = resampleArea(crop, w, h, tw, th);
  let mass = 0;
  let mx = 0;
  let my = 0;
  for (let y = 0; y < th; y++) {
    for (let x = 0; x < tw; x++) {
      const v = box[y * tw + x];
      mass += v;
      mx += (x + 0.5) * v;
      my += (y + 0.5) * v;
    }
  }
  const left = Math.min(SIDE - tw, Math.max(0, Math.round(SIDE / 2 - mx / mass)));
  const top = Math.min(SIDE - th, Math.max(0, Math.round(SIDE / 2 - my / mass)));
  for (let y = 0; y < th; y++) {
    for (let x = 0; x < tw; x++) {
      out[(top + y) * SIDE + left + x] = Math.round(255 * Math.min(1, box[y * tw + x]));
    }
  }
  return out;
}

function drawPixels(canvas, pixels) {
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(SIDE, SIDE);
  for (let i = 0; i < pixels.length; i++) {
    image.data.set([pixels[i], pixels[i], pixels[i], 255], 4 * i);
  }
  ctx.putImageData(image, 0, 0);
}

/** Show `pixels` (28×28, 0…255) scaled up on the drawing pad. */
function paintPad(pixels) {
  const small = document.createElement("canvas");
  small.width = SIDE;
  small.height = SIDE;
  drawPixels(small, pixels);
  const ctx = pad.getContext("2d");
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(small, 0, 0, pad.width, pad.height);
}

// ---- the drawing pad ------------------------------------------------------------------------

const pad = $("pad");
const padCtx = pad.getContext("2d", { willReadFrequently: true });
let drawing = false;
let drawnOnPad = false; // the pad holds a drawing (preprocess it) rather than a loaded digit

function clearPad() {
  padCtx.fillStyle = "#000";
  padCtx.fillRect(0, 0, pad.width, pad.height);
}

function padPoint(event) {
  const rect = pad.getBoundingClientRect();
  return [
    ((event.clientX - rect.left) * pad.width) / rect.width,
    ((event.clientY - rect.top) * pad.height) / rect.height,
  ];
}

function startStroke(event) {
  event.preventDefault();
  pad.setPointerCapture?.(event.pointerId);
  if (!drawnOnPad) {
    clearPad(); // a loaded digit is replaced, not drawn over
    drawnOnPad = true;
  }
  drawing = true;
  const [x, y] = padPoint(event);
  padCtx.strokeStyle = "#fff";
  padCtx.fillStyle = "#fff";
  padCtx.lineWidth = 22;
  padCtx.lineCap = "round";
  padCtx.lineJoin = "round";
  padCtx.beginPath();
  padCtx.arc(x, y, padCtx.lineWidth / 2, 0, 2 * Math.PI);
  padCtx.fill();
  padCtx.beginPath();
  padCtx.moveTo(x, y);
}

function continueStroke(event) {
  if (!drawing) return;
  event.preventDefault();
  const [x, y] = padPoint(event);
  padCtx.lineTo(x, y);
  padCtx.stroke();
  padCtx.beginPath();
  padCtx.moveTo(x, y);
}

function endStroke() {
  if (!drawing) return;
  drawing = false;
  setInput(mnistPixels(greyOf(pad), pad.width, pad.height), "Your drawing, scaled and centred.");
}

pad.addEventListener("pointerdown", startStroke);
pad.addEventListener("pointermove", continueStroke);
pad.addEventListener("pointerup", endStroke);
pad.addEventListener("pointercancel", endStroke);
pad.addEventListener("pointerleave", endStroke);

$("clear").addEventListener("click", () => {
  clearPad();
  drawnOnPad = true;
  state.pixels = null;
  state.prediction = null;
  drawPixels($("sent"), new Uint8Array(SIDE * SIDE));
  $("answer").hidden = true;
  $("answer-empty").hidden = false;
  $("attack-result").hidden = true;
  $("download-png").hidden = true;
  $("input-note").textContent = "Cleared. Draw a digit, large and centred.";
  pad.focus();
});

// ---- random test digit ----------------------------------------------------------------------

let digits = null;

async function loadDigits() {
  if (digits) return digits;
  const manifest = await fetchJSON("/static/digits.json");
  const image = new Image();
  image.src = "/static/digits.png";
  await image.decode();
  const sheet = document.createElement("canvas");
  sheet.width = image.width;
  sheet.height = image.height;
  const ctx = sheet.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(image, 0, 0);
  digits = { manifest, ctx };
  return digits;
}

async function randomDigit() {
  const { manifest, ctx } = await loadDigits();
  const i = Math.floor(Math.random() * manifest.count);
  const t = manifest.tile;
  const x = (i % manifest.columns) * t;
  const y = Math.floor(i / manifest.columns) * t;
  const rgba = ctx.getImageData(x, y, t, t).data;
  const pixels = new Uint8Array(t * t);
  for (let j = 0; j < pixels.length; j++) pixels[j] = rgba[4 * j];
  drawnOnPad = false;
  paintPad(pixels);
  setInput(pixels, `MNIST test image #${manifest.indices[i]}, true label ${manifest.labels[i]}.`);
}

/** Run an input action (load, upload); the page is busy from its start to the answer. */
function inputAction(action, failure) {
  document.body.dataset.busy = "input";
  action().catch((error) => {
    delete document.body.dataset.busy;
    status(`${failure}: ${error.message}`);
  });
}

$("random").addEventListener("click", () => inputAction(randomDigit, "Cannot load the test digits"));

// ---- PNG upload -----------------------------------------------------------------------------

async function uploaded(file) {
  const image = new Image();
  const url = URL.createObjectURL(file);
  try {
    image.src = url;
    await image.decode();
  } finally {
    URL.revokeObjectURL(url);
  }
  const exact = image.width === SIDE && image.height === SIDE;
  const canvas = document.createElement("canvas");
  canvas.width = exact ? SIDE : pad.width;
  canvas.height = exact ? SIDE : pad.height;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  ctx.fillStyle = "#fff"; // transparent pixels count as paper
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const fit = Math.min(canvas.width / image.width, canvas.height / image.height);
  const [w, h] = [image.width * fit, image.height * fit];
  ctx.drawImage(image, (canvas.width - w) / 2, (canvas.height - h) / 2, w, h);
  const grey = greyOf(canvas);
  const mean = grey.reduce((a, b) => a + b, 0) / grey.length;
  if (mean > 0.5) for (let i = 0; i < grey.length; i++) grey[i] = 1 - grey[i]; // dark ink on light paper
  let pixels;
  if (exact) {
    pixels = Uint8Array.from(grey, (v) => Math.round(255 * v));
  } else {
    pixels = mnistPixels(grey, canvas.width, canvas.height);
  }
  drawnOnPad = false;
  paintPad(pixels);
  const how = exact ? "sent as it is" : "scaled and centred like a drawing";
  setInput(pixels, `Uploaded ${file.name} (${image.width}×${image.height}, ${how}${mean > 0.5 ? ", inverted" : ""}).`);
}

$("upload").addEventListener("change", (event) => {
  const [file] = event.target.files;
  if (file) inputAction(() => uploaded(file), `${file.name}: not an image this browser can read`);
  event.target.value = "";
});

// ---- prediction -----------------------------------------------------------------------------

function options() {
  const k = Number($("opt-k").value) || state.model?.calibration.mc_samples || 20;
  const seed = Number($("opt-seed").value) || 0;
  return { k, seed };
}

function setInput(pixels, note) {
  state.pixels = pixels;
  state.png = encodePNG(pixels, SIDE, SIDE);
  drawPixels($("sent"), pixels);
  const link = $("download-png");
  link.href = `data:image/png;base64,${base64(state.png)}`; // the exact bytes sent
  link.hidden = false;
  $("input-note").textContent = note;
  $("attack-result").hidden = true;
  state.attack = null;
  predict();
}

async function predict() {
  const id = ++state.requestId;
  const { k, seed } = options();
  const form = new FormData();
  form.append("file", new Blob([state.png], { type: "image/png" }), "digit.png");
  form.append("mc_samples", String(k));
  form.append("seed", String(seed));
  form.append("return_samples", "true");
  document.body.dataset.busy = "predict";
  try {
    const answer = await fetchJSON("/v1/predict/file", { method: "POST", body: form });
    if (id !== state.requestId) return; // a newer digit is on its way
    state.prediction = answer.predictions[0];
    showAnswer(state.prediction, answer);
    status(`Answered with K = ${answer.mc_samples} passes, seed ${answer.seed}.`);
  } catch (error) {
    if (id === state.requestId) status(`Prediction failed: ${error.message}`);
  } finally {
    if (id === state.requestId) delete document.body.dataset.busy;
  }
}

// ---- showing an answer ----------------------------------------------------------------------

function flagText(p, short = false) {
  const name = scoreTitle(p.score_name);
  if (short) return p.adversarial ? `⚠ Flagged: ${name} ${fmt(p.score)} > ${fmt(p.threshold)}` : `✓ Not flagged: ${name} ${fmt(p.score)} ≤ ${fmt(p.threshold)}`;
  return p.adversarial
    ? `⚠ Flagged: adversarial or out of distribution (${name} ${fmt(p.score)} > threshold ${fmt(p.threshold)})`
    : `✓ Not flagged (${name} ${fmt(p.score)} ≤ threshold ${fmt(p.threshold)})`;
}

function showFlag(el, p, short = false) {
  el.textContent = flagText(p, short);
  el.classList.toggle("flagged", p.adversarial);
  el.classList.toggle("clean", !p.adversarial);
  el.dataset.adversarial = String(p.adversarial);
}

function showAnswer(p, response) {
  $("answer").hidden = false;
  $("answer-empty").hidden = true;
  const label = $("label");
  label.textContent = p.class_name;
  label.dataset.value = String(p.label);
  $("label-prob").textContent = `p̄ = ${pct(p.probabilities[p.label])}`;
  showFlag($("flag"), p);
  for (const [id, value] of [
    ["entropy", p.predictive_entropy],
    ["mutual-information", p.mutual_information],
    ["variation-ratio", p.variation_ratio],
  ]) {
    $(id).textContent = fmt(value, 4);
    $(id).dataset.value = String(value);
  }
  showGauge(p);
  showBars(p);
  showSpread(p, response.mc_samples);
  showExtraScores(p);
}

function showBars(p) {
  const list = $("bars");
  list.replaceChildren();
  p.probabilities.forEach((prob, c) => {
    const item = document.createElement("li");
    item.className = c === p.label ? "bar top" : "bar";
    item.dataset.value = String(prob);
    item.setAttribute("aria-label", `digit ${c}: ${pct(prob)}`);
    const digit = document.createElement("span");
    digit.className = "digit";
    digit.textContent = String(c);
    const track = document.createElement("span");
    track.className = "track";
    const fill = document.createElement("span");
    fill.className = "fill";
    fill.style.width = `${(100 * prob).toFixed(2)}%`;
    track.append(fill);
    const text = document.createElement("span");
    text.className = "pct";
    text.textContent = pct(prob);
    item.append(digit, track, text);
    list.append(item);
  });
}

/** The range a score is drawn on: [0, ln C] for entropy and MI, [0, 1] for the variation
 * ratio; any other score (e.g. the fused detector's logit, which may be negative) gets a range
 * around its value, its threshold and 0. */
function scoreRange(name, score, threshold) {
  const known = { predictive_entropy: LN10, mutual_information: LN10, variation_ratio: 1 };
  if (name in known) return [0, Math.max(known[name], 1.1 * score)];
  const lo = Math.min(0, score, threshold);
  const hi = Math.max(0, score, threshold);
  const pad = Math.max(1, 0.15 * (hi - lo));
  return [lo - pad, hi + pad];
}

/** The score that decides the flag, on its range, with the threshold marked. */
function showGauge(p) {
  const svg = $("gauge");
  clearSvg(svg);
  const [lo, hi] = scoreRange(p.score_name, p.score, p.threshold);
  const [x0, x1, y] = [12, 408, 28];
  const at = (v) => x0 + ((x1 - x0) * (Math.max(lo, Math.min(v, hi)) - lo)) / (hi - lo);
  svg.append(
    svgEl("rect", { x: x0, y: y - 8, width: at(p.threshold) - x0, height: 16, class: "zone-clean" }),
    svgEl("rect", { x: at(p.threshold), y: y - 8, width: x1 - at(p.threshold), height: 16, class: "zone-flag" }),
    svgEl("line", { x1: at(p.threshold), x2: at(p.threshold), y1: y - 14, y2: y + 14, class: "threshold" }),
    svgEl("text", { x: at(p.threshold), y: y - 17, class: "tick", "text-anchor": "middle" }, `threshold ${fmt(p.threshold)}`),
    svgEl("path", { d: `M${at(p.score)},${y + 9} l-7,12 h14 z`, class: p.adversarial ? "marker flagged" : "marker clean" }),
    svgEl("text", { x: x0, y: y + 32, class: "tick" }, fmt(lo, 2)),
    svgEl("text", { x: x1, y: y + 32, class: "tick", "text-anchor": "end" }, fmt(hi, 2)),
  );
  $("gauge-title").textContent = `${scoreTitle(p.score_name)} ${fmt(p.score)} against threshold ${fmt(p.threshold)}`;
  const fpr = targetFpr();
  $("gauge-caption").textContent =
    `${scoreTitle(p.score_name)} = ${fmt(p.score)} decides the flag; its threshold ${fmt(p.threshold)} flags ` +
    (fpr !== undefined ? `${pct(fpr)} of clean validation digits.` : "few clean digits.");
}

/** The target false-positive rate of the flag's threshold (/v1/models reports the detector's
 * when it decides); undefined for an admin threshold that no fit set (target_fpr_applies). */
function targetFpr() {
  const cal = state.model?.calibration;
  return cal && cal.target_fpr_applies !== false ? cal.target_fpr ?? undefined : undefined;
}

/** The K per-pass probabilities of the three most probable classes: one dot per pass. */
function showSpread(p, k) {
  const svg = $("spread");
  clearSvg(svg);
  if (!p.samples) return;
  const top = p.probabilities
    .map((v, c) => [v, c])
    .sort((a, b) => b[0] - a[0])
    .slice(0, 3)
    .map(([, c]) => c);
  const [x0, x1] = [64, 408];
  const at = (v) => x0 + (x1 - x0) * v;
  for (const v of [0, 0.5, 1]) {
    svg.append(
      svgEl("line", { x1: at(v), x2: at(v), y1: 6, y2: 96, class: "grid" }),
      svgEl("text", { x: at(v), y: 112, class: "tick", "text-anchor": "middle" }, String(v)),
    );
  }
  const summary = [];
  top.forEach((c, row) => {
    const y = 20 + row * 30;
    const values = p.samples.map((s) => s[c]);
    svg.append(svgEl("text", { x: 8, y: y + 4, class: "row-label" }, `digit ${c}`));
    for (const v of values) svg.append(svgEl("circle", { cx: at(v), cy: y, r: 4.5, class: "pass" }));
    svg.append(svgEl("line", { x1: at(p.probabilities[c]), x2: at(p.probabilities[c]), y1: y - 10, y2: y + 10, class: "mean" }));
    summary.push(`digit ${c}: mean ${fmt(p.probabilities[c], 2)}, passes from ${fmt(Math.min(...values), 2)} to ${fmt(Math.max(...values), 2)}`);
  });
  $("spread-title").textContent = `${k} passes. ${summary.join("; ")}.`;
}

const SHOWN_SCORES = new Set(["predictive_entropy", "mutual_information", "variation_ratio"]);

/** Detector scores beyond the three uncertainty measures (`scores`, e.g. the fused detector's),
 * each with its own threshold when the model has one; hidden when there are none. */
function showExtraScores(p) {
  const box = $("extra-scores");
  const body = box.querySelector("tbody");
  body.replaceChildren();
  const thresholds = state.model?.calibration.thresholds ?? {};
  const scores = p.scores && typeof p.scores === "object" ? p.scores : {};
  for (const [name, value] of Object.entries(scores)) {
    if (SHOWN_SCORES.has(name)) continue;
    const cells = [scoreTitle(name) + (name === p.score_name ? " (decides the flag)" : ""), "", ""];
    if (typeof value === "number") {
      cells[1] = fmt(value, 4);
      const t = thresholds[name];
      if (typeof t === "number") cells[2] = `${fmt(t, 4)} (${value > t ? "above" : "below"})`;
    } else if (value && typeof value === "object") {
      cells[1] = Object.entries(value).map(([k, v]) => `${k} ${typeof v === "number" ? fmt(v, 4) : String(v)}`).join(", ");
    } else {
      cells[1] = String(value);
    }
    const row = document.createElement("tr");
    if (name === p.score_name) row.className = "decides";
    cells.forEach((text, i) => {
      const cell = document.createElement(i === 0 ? "th" : "td");
      if (i === 0) cell.scope = "row";
      cell.textContent = text;
      row.append(cell);
    });
    body.append(row);
  }
  box.hidden = body.childElementCount === 0;
}

// ---- the attack panel -----------------------------------------------------------------------

function method() {
  return document.querySelector('input[name="method"]:checked').value;
}

function showMethodControls() {
  for (const el of document.querySelectorAll(".slider[data-for]")) el.hidden = el.dataset.for !== method();
}

function nearestResult(eta) {
  if (!state.attack || state.attack.method !== "fgs") return null;
  return state.attack.results.reduce((a, b) => (Math.abs(b.eta - eta) < Math.abs(a.eta - eta) ? b : a));
}

function compactAnswer(el, p) {
  const label = document.createElement("span");
  label.className = "big-label";
  label.textContent = p.class_name;
  label.dataset.value = String(p.label);
  const line = document.createElement("span");
  line.className = "compact";
  line.textContent = `p̄ ${pct(p.probabilities[p.label])} · entropy ${fmt(p.predictive_entropy)} · MI ${fmt(p.mutual_information)}`;
  const flag = document.createElement("span");
  flag.className = "flag small";
  showFlag(flag, p, true);
  el.replaceChildren(label, line, flag);
}

function showAttackResult(result) {
  const a = state.attack;
  drawPixels($("orig-image"), state.pixels);
  compactAnswer($("orig-answer"), a.original);
  const pixels = Uint8Array.from(result.instance.flat(), (v) => Math.round(255 * v));
  drawPixels($("adv-image"), pixels);
  $("adv-title").textContent =
    a.method === "fgs"
      ? `adversarial, FGS η = ${fmt(result.eta)}`
      : `adversarial, PGD ε = ${fmt(result.eps, 2)}, ${result.steps} steps`;
  $("adv-image").setAttribute("aria-label", `${$("adv-title").textContent} (‖x′ − x‖∞ = ${fmt(result.linf)})`);
  compactAnswer($("adv-answer"), result.prediction);
  $("attack-result").hidden = false;
  $("attack-result").dataset.method = a.method;
  const p = result.prediction;
  const change = p.label === a.original.label ? `stays ${p.class_name}` : `changes ${a.original.class_name} → ${p.class_name}`;
  const where = a.method === "fgs" ? `At η = ${fmt(result.eta)}` : `After ${result.steps} PGD steps in ε = ${fmt(result.eps, 2)}`;
  $("attack-status").textContent = `${where} the label ${change} and the input is ${p.adversarial ? "flagged" : "not flagged"}.` +
    (a.method === "fgs" ? " Move the η slider to see the other step sizes." : "");
}

/** Entropy of the answer against η, the threshold line, flagged points as triangles. */
function showSweep(selectedEta) {
  const svg = $("sweep");
  clearSvg(svg);
  const a = state.attack;
  if (!a || a.method !== "fgs") {
    svg.parentElement.hidden = true;
    return;
  }
  svg.parentElement.hidden = false;
  const points = a.results.map((r) => ({ eta: r.eta, p: r.prediction }));
  const entropyThreshold =
    a.original.score_name === "predictive_entropy"
      ? a.original.threshold
      : state.model?.calibration.thresholds?.predictive_entropy;
  const yTop = LN10;
  const [x0, x1, y0, y1] = [52, 444, 216, 22];
  const X = (v) => x0 + ((x1 - x0) * v) / 0.5;
  const Y = (v) => y0 - ((y0 - y1) * Math.min(v, yTop)) / yTop;
  for (const v of [0, 0.1, 0.2, 0.3, 0.4, 0.5]) {
    svg.append(
      svgEl("line", { x1: X(v), x2: X(v), y1: y1, y2: y0, class: "grid" }),
      svgEl("text", { x: X(v), y: y0 + 16, class: "tick", "text-anchor": "middle" }, String(v)),
    );
  }
  for (const v of [0, 0.5, 1, 1.5, 2]) {
    svg.append(
      svgEl("line", { x1: x0, x2: x1, y1: Y(v), y2: Y(v), class: "grid" }),
      svgEl("text", { x: x0 - 6, y: Y(v) + 4, class: "tick", "text-anchor": "end" }, String(v)),
    );
  }
  svg.append(
    svgEl("text", { x: (x0 + x1) / 2, y: y0 + 32, class: "axis", "text-anchor": "middle" }, "FGS step size η"),
    svgEl("text", { x: 14, y: (y0 + y1) / 2, class: "axis", "text-anchor": "middle", transform: `rotate(-90 14 ${(y0 + y1) / 2})` }, "predictive entropy (nats)"),
  );
  if (typeof entropyThreshold === "number") {
    const t = entropyThreshold;
    const own = a.original.score_name === "predictive_entropy" ? "threshold" : "entropy's own threshold";
    svg.append(
      svgEl("line", { x1: x0, x2: x1, y1: Y(t), y2: Y(t), class: "threshold" }),
      svgEl("text", { x: x0 + 4, y: Y(t) + 13, class: "tick" }, `${own} ${fmt(t)}`),
    );
  }
  $("sweep-flag-by").textContent = scoreTitle(a.original.score_name);
  svg.append(svgEl("polyline", { points: points.map((q) => `${X(q.eta)},${Y(q.p.predictive_entropy)}`).join(" "), class: "curve" }));
  for (const q of points) {
    const [x, y] = [X(q.eta), Y(q.p.predictive_entropy)];
    const selected = Math.abs(q.eta - selectedEta) < 1e-9;
    const mark = q.p.adversarial
      ? svgEl("path", { d: `M${x},${y - 6} l6,10 h-12 z`, class: "point flagged" })
      : svgEl("circle", { cx: x, cy: y, r: 4.5, class: "point clean" });
    if (selected) mark.classList.add("selected");
    svg.append(mark);
    svg.append(svgEl("text", { x, y: y - 10, class: selected ? "point-label selected" : "point-label", "text-anchor": "middle" }, q.p.class_name));
  }
  const flagged = points.filter((q) => q.p.adversarial).map((q) => fmt(q.eta, 3));
  $("sweep-title").textContent =
    `Predictive entropy against FGS step size for this digit; flagged at η = ${flagged.join(", ") || "none"}.`;
}

async function runAttack(event) {
  event.preventDefault();
  if (!state.pixels) {
    $("attack-status").textContent = "Draw or load a digit first.";
    return;
  }
  const { k, seed } = options();
  const body = { image: base64(state.png), method: method(), mc_samples: k, seed };
  body.attack_mc_samples = state.config.attack.default_attack_mc_samples;
  if (body.method === "fgs") body.etas = FGS_ETAS;
  else Object.assign(body, { eps: Number($("eps").value), steps: Number($("steps").value) });
  const button = $("run-attack");
  button.disabled = true;
  document.body.dataset.busy = "attack";
  $("attack-status").textContent = body.method === "fgs" ? `Running FGS at ${FGS_ETAS.length} step sizes…` : "Running PGD…";
  try {
    let answer;
    for (let attempt = 0; ; attempt++) {
      try {
        answer = await fetchJSON("/v1/attack", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
        });
        break;
      } catch (error) {
        if (error.status !== 503 || attempt >= 4) throw error;
        $("attack-status").textContent = `The server is busy with another attack; retrying in ${error.retryAfter || 1} s…`;
        await sleep(1000 * (error.retryAfter || 1));
      }
    }
    state.attack = answer;
    const eta = Number($("eta").value);
    showAttackResult(answer.method === "fgs" ? nearestResult(eta) : answer.results[0]);
    showSweep(eta);
  } catch (error) {
    $("attack-status").textContent = `Attack failed: ${error.message}`;
  } finally {
    button.disabled = false;
    delete document.body.dataset.busy;
  }
}

function etaChanged() {
  const eta = Number($("eta").value);
  $("eta-value").textContent = fmt(eta);
  const result = nearestResult(eta);
  if (result) {
    showAttackResult(result);
    showSweep(eta);
  }
}

$("attack-form").addEventListener("submit", runAttack);
$("eta").addEventListener("input", etaChanged);
$("eps").addEventListener("input", () => ($("eps-value").textContent = fmt($("eps").value, 2)));
for (const radio of document.querySelectorAll('input[name="method"]')) radio.addEventListener("change", showMethodControls);

// ---- start ----------------------------------------------------------------------------------

function showModel(model, config) {
  const cal = model.calibration;
  $("model-name").textContent = model.name;
  $("model-k").textContent = String(cal.mc_samples);
  $("model-score").textContent = scoreTitle(cal.score);
  $("model-threshold").textContent = fmt(cal.threshold, 4);
  const fpr = targetFpr();
  $("model-fpr").textContent = fpr !== undefined ? pct(fpr) : "set by the admin";
  const docs = $("docs-link");
  if (config.docs_url) docs.href = config.docs_url;
  else docs.replaceWith(document.createTextNode("docs off on this server"));
  $("opt-k").value = String(Math.min(cal.mc_samples, config.max_mc_samples));
  $("opt-k").max = String(config.max_mc_samples);
  $("steps").max = String(config.attack.max_steps);
}

async function start() {
  clearPad();
  drawPixels($("sent"), new Uint8Array(SIDE * SIDE));
  state.config = await fetchJSON("/v1/demo");
  $("attack-panel").hidden = !state.config.attack.enabled;
  for (;;) {
    try {
      state.model = (await fetchJSON("/v1/models")).models[0];
      break;
    } catch (error) {
      status(`Waiting for the model (${error.message})…`);
      await sleep(1000);
    }
  }
  showModel(state.model, state.config);
  status("Ready: draw a digit, or load a random test digit.");
  document.body.dataset.state = "ready";
}

start().catch((error) => status(`The page could not start: ${error.message}`));
