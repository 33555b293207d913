// The learning curve: a line plot on a canvas, written here (about a hundred lines) rather than a
// charting library, so the page stays dependency-free apart from onnxruntime-web and needs no build.

/** Keys tried, in order, for the y value of a metrics.jsonl line. */
export const RETURN_KEYS = ["return_mean", "charts/episodic_return", "episodic_return", "return"];

/** Parse metrics.jsonl text into [{x: step, y: return}] (lines without both are skipped). */
export function parseMetrics(text) {
  const points = [];
  for (const line of text.split("\n")) {
    if (!line.trim()) continue;
    let row;
    try {
      row = JSON.parse(line);
    } catch {
      continue; // a partially written last line while training goes on
    }
    const key = RETURN_KEYS.find((k) => typeof row[k] === "number" && Number.isFinite(row[k]));
    if (typeof row.step === "number" && key) points.push({ x: row.step, y: row[key] });
  }
  return points;
}

/** Round-number tick values covering [lo, hi], spaced 1, 2 or 5 times a power of ten;
 * `integer`: never closer than 1 apart (env steps are whole numbers). */
export function ticks(lo, hi, count, { integer = false } = {}) {
  if (hi === lo) return [lo];
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  if (integer) step = Math.max(step, 1);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
  return out;
}

/** Labels for evenly spaced tick values: one unit for the axis (k, M) and as many decimals as the
 * spacing needs, so neighbouring labels always differ (5.55k and 5.6k, never 5.6k twice). */
export function tickLabels(values) {
  const big = Math.max(...values.map(Math.abs));
  const [div, unit] = big >= 1e6 ? [1e6, "M"] : big >= 1e3 ? [1e3, "k"] : [1, ""];
  if (values.length < 2) return values.map((v) => `${+(v / div).toFixed(3)}${unit}`);
  const step = Math.abs(values[1] - values[0]) / div;
  // a step of 0.1 needs 1 decimal, 0.05 needs 2; the epsilon absorbs float noise in the step
  const decimals = Math.max(0, Math.ceil(-Math.log10(step) - 1e-9));
  return values.map((v) => `${(v / div).toFixed(decimals)}${unit}`);
}

/** Draw the points on the canvas (device-pixel aware); a message when there are none. */
export function drawCurve(canvas, points, { title = "return (mean) vs steps", color = "#2f9e44" } = {}) {
  const dpr = globalThis.devicePixelRatio || 1;
  const cssW = canvas.clientWidth || canvas.width;
  const cssH = canvas.clientHeight || canvas.height;
  canvas.width = Math.round(cssW * dpr);
  canvas.height = Math.round(cssH * dpr);
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, cssW, cssH);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#555";
  ctx.fillText(title, 8, 13);
  if (points.length === 0) {
    ctx.fillText("no metrics.jsonl for this model", 8, cssH / 2);
    return;
  }
  const pad = { left: 44, right: 12, top: 22, bottom: 22 };
  const w = cssW - pad.left - pad.right;
  const h = cssH - pad.top - pad.bottom;
  let [x0, x1] = [Infinity, -Infinity];
  let [y0, y1] = [Infinity, -Infinity];
  for (const p of points) {
    x0 = Math.min(x0, p.x);
    x1 = Math.max(x1, p.x);
    y0 = Math.min(y0, p.y);
    y1 = Math.max(y1, p.y);
  }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) [y0, y1] = [y0 - 1, y1 + 1];
  const sx = (x) => pad.left + ((x - x0) / (x1 - x0)) * w;
  const sy = (y) => pad.top + h - ((y - y0) / (y1 - y0)) * h;

  ctx.strokeStyle = "#e3e3e3";
  ctx.lineWidth = 1;
  ctx.fillStyle = "#777";
  ctx.textAlign = "right";
  const yTicks = ticks(y0, y1, 4);
  tickLabels(yTicks).forEach((label, i) => {
    ctx.beginPath();
    ctx.moveTo(pad.left, sy(yTicks[i]));
    ctx.lineTo(pad.left + w, sy(yTicks[i]));
    ctx.stroke();
    ctx.fillText(label, pad.left - 4, sy(yTicks[i]) + 4);
  });
  ctx.textAlign = "center";
  const xTicks = ticks(x0, x1, 5, { integer: true });
  tickLabels(xTicks).forEach((label, i) => ctx.fillText(label, sx(xTicks[i]), pad.top + h + 15));
  ctx.textAlign = "left";

  ctx.strokeStyle = color;
  ctx.lineWidth = 1.5;
  ctx.beginPath();
  points.forEach((p, i) => (i === 0 ? ctx.moveTo(sx(p.x), sy(p.y)) : ctx.lineTo(sx(p.x), sy(p.y))));
  ctx.stroke();
  if (points.length === 1) {
    ctx.fillStyle = color;
    ctx.fillRect(sx(points[0].x) - 2, sy(points[0].y) - 2, 4, 4);
  }
}
