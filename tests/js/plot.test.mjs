// node --test tests/js/ : the learning curve's axis ticks (web/src/plot.js), e.g. a CartPole run
// solved at 5,632 steps, whose chart once labelled every tick "5.6k".
import assert from "node:assert/strict";
import { test } from "node:test";

import { tickLabels, ticks } from "../../web/src/plot.js";

/** The labels drawn on an axis covering [lo, hi]. */
const axis = (lo, hi, count, opts) => tickLabels(ticks(lo, hi, count, opts));

const distinct = (labels) => new Set(labels).size === labels.length;

test("a narrow step range near 5.6k: every label differs", () => {
  for (const [lo, hi] of [[5376, 5632], [5500, 5632], [5600, 5632], [5631, 5632], [5120, 5632]]) {
    const labels = axis(lo, hi, 5, { integer: true });
    assert.ok(labels.length >= 2, `${lo}..${hi}: ${labels}`);
    assert.ok(distinct(labels), `${lo}..${hi}: ${labels}`);
  }
});

test("one metrics point (the chart pads x by 1): whole steps, not 5632.2", () => {
  const values = ticks(5632, 5633, 5, { integer: true });
  assert.deepEqual(values, [5632, 5633]);
  assert.deepEqual(tickLabels(values), ["5.632k", "5.633k"]);
});

test("labels keep only the decimals the spacing needs", () => {
  assert.deepEqual(axis(0, 100_000, 5), ["0k", "20k", "40k", "60k", "80k", "100k"]);
  assert.deepEqual(axis(5500, 5600, 5), ["5.50k", "5.52k", "5.54k", "5.56k", "5.58k", "5.60k"]);
  assert.deepEqual(axis(0, 8_000_000, 5), ["0M", "2M", "4M", "6M", "8M"]);
  assert.deepEqual(axis(-1, 2, 4), ["-1", "0", "1", "2"]);
  assert.deepEqual(axis(-1, 1, 4), ["-1.0", "-0.5", "0.0", "0.5", "1.0"]);
});

test("small return ranges stay distinct and readable", () => {
  for (const [lo, hi] of [[499, 501], [499.9, 500.1], [0.001, 0.002], [9.5, 10.5], [-0.88, -0.87]]) {
    const labels = axis(lo, hi, 4);
    assert.ok(distinct(labels), `${lo}..${hi}: ${labels}`);
    assert.ok(labels.every((l) => l.length <= 7), `${lo}..${hi}: ${labels}`);
  }
});
