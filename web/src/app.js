// The page: model picker, game loop (model or keyboard), board drawing, stats and the learning curve.

import { ModelError, Policy } from "./model.js";
import { drawCurve, parseMetrics } from "./plot.js";
import * as snake from "./snake.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const MAX_SPEED = 61; // the slider's last stop: as fast as inference allows
const END_PAUSE_MS = 700; // how long a finished episode stays on screen (not at max speed)

const ui = {
  select: $("model-select"),
  status: $("status"),
  error: $("error"),
  board: $("board"),
  curve: $("curve"),
  speed: $("speed"),
  speedLabel: $("speed-label"),
  seed: $("seed"),
  restart: $("restart"),
  mode: $("mode"),
  pause: $("pause"),
  manifest: $("manifest"),
  modelsNote: $("models-note"),
};

const state = {
  models: [],
  entry: null, // the listing entry of the current model
  policy: null,
  game: null,
  human: params.get("mode") === "human",
  paused: false,
  wantDir: null, // the keyboard's last direction, applied at the next tick
  generation: 0, // bumped on every restart / model change: an older loop sees it and stops
  episode: 1,
  best: 0,
  moves: 0,
  inferMs: [], // the last 100 inference times
  frames: 0,
  totalFrames: 0, // frames drawn since the page opened (for the benchmark)
  fps: 0,
  mps: 0,
  lastOutcome: null,
  scores: [], // apples eaten per finished episode
  error: null,
  dirty: true,
};

// For tests and the benchmark: the live state and the modules, no hidden globals elsewhere.
const api = { state, snake, Policy, ModelError, loadModel, restart };
let markReady;
api.ready = new Promise((resolve) => (markReady = resolve));
window.thrust = api;

function setStatus(text) {
  ui.status.textContent = text;
}

function showError(message) {
  state.error = message;
  ui.error.textContent = message;
  ui.error.hidden = false;
  setStatus("error");
  state.dirty = true;
}

function clearError() {
  state.error = null;
  ui.error.hidden = true;
  ui.error.textContent = "";
}

// ---- the model listing -------------------------------------------------------------------------

/** Entries {name, model, manifest, metrics}: from the play server's /api/models, else public/index.json. */
async function listModels() {
  for (const url of ["api/models", "public/index.json"]) {
    try {
      const response = await fetch(url, { cache: "no-store" });
      if (!response.ok) continue;
      const body = await response.json();
      const rows = Array.isArray(body) ? body : body.models;
      if (!Array.isArray(rows)) continue;
      return rows.map((row) => {
        const entry = typeof row === "string" ? { name: row } : { ...row };
        entry.model ??= `public/${entry.name}.onnx`;
        entry.manifest ??= `public/${entry.name}.json`;
        if (entry.metrics === undefined) entry.metrics = `public/${entry.name}.metrics.jsonl`;
        return entry;
      });
    } catch {
      // try the next source
    }
  }
  return [];
}

const GROUPS = [
  ["given", "given with --model"],
  ["placed", "placed in web/public"],
  ["kept", "kept runs, newest first"],
];

/** The page plays snake only: anything else is listed, marked, and named in the note. */
function playable(entry) {
  return entry.playable ?? (entry.env === undefined || entry.env === "snake");
}

function scoreText(entry) {
  if (typeof entry.score !== "number") return null;
  return `${entry.score.toFixed(2)} ${entry.score_kind ?? "score"}`;
}

function optionLabel(entry) {
  const parts = [entry.name];
  if (entry.group === "kept" && entry.state) parts.push(entry.state);
  if (entry.steps) parts.push(`${Number(entry.steps).toLocaleString("en")} steps`);
  const score = scoreText(entry);
  if (score) parts.push(score);
  let label = parts.join(" · ");
  if (entry.group === "kept" && entry.placed) label += " (placed)";
  if (!playable(entry)) label += ` (${entry.env}: not playable here)`;
  return label;
}

function fillPicker() {
  ui.select.replaceChildren();
  const known = new Set(GROUPS.map(([key]) => key));
  for (const [key, title] of [...GROUPS, [null, "models"]]) {
    const entries = state.models.filter((m) => (key === null ? !known.has(m.group) : m.group === key));
    if (entries.length === 0) continue;
    const group = document.createElement("optgroup");
    group.label = title;
    for (const entry of entries) {
      const option = document.createElement("option");
      option.value = entry.name;
      option.textContent = optionLabel(entry);
      if (!playable(entry)) option.dataset.unplayable = "true";
      group.append(option);
    }
    ui.select.append(group);
  }
  ui.select.disabled = state.models.length === 0;
  const unplayable = state.models.filter((m) => !playable(m));
  ui.modelsNote.hidden = unplayable.length === 0;
  ui.modelsNote.textContent = unplayable.length
    ? `Listed but not playable here (this page plays snake only): ${unplayable.map((m) => `${m.name} (${m.env})`).join(", ")}.`
    : "";
}

function showManifest(manifest, entry) {
  ui.manifest.replaceChildren();
  if (!manifest) return;
  const rows = [
    ["run", entry?.run_id],
    ["host", entry?.host],
    ["state", entry?.state],
    ["score", entry && scoreText(entry)],
    ["fetched", entry?.fetched_at],
    ["env", manifest.env],
    ["grid", manifest.grid_size && `${manifest.grid_size}×${manifest.grid_size}`],
    ["actions", manifest.action_mode && `${manifest.action_mode} (${manifest.n_actions ?? "?"})`],
    ["policy", manifest.policy],
    ["steps", manifest.steps !== undefined && Number(manifest.steps).toLocaleString("en")],
    ["final return", typeof manifest.final_return === "number" && manifest.final_return.toFixed(3)],
    ["opset", manifest.opset],
    ["sha256", manifest.sha256 && `${String(manifest.sha256).slice(0, 16)}…`],
  ];
  for (const [key, value] of rows) {
    if (value === undefined || value === null || value === false) continue;
    const dt = document.createElement("dt");
    dt.textContent = key;
    const dd = document.createElement("dd");
    dd.textContent = String(value);
    ui.manifest.append(dt, dd);
  }
}

async function loadCurve(entry) {
  let points = [];
  if (entry?.metrics) {
    try {
      const response = await fetch(entry.metrics, { cache: "no-store" });
      if (response.ok) points = parseMetrics(await response.text());
    } catch {
      points = [];
    }
  }
  drawCurve(ui.curve, points);
}

// ---- loading a model ---------------------------------------------------------------------------

let loadToken = 0; // a newer loadModel call wins over one still loading

async function loadModel(name) {
  const token = ++loadToken;
  const entry = state.models.find((m) => m.name === name);
  state.generation += 1; // stop the running loop
  state.policy?.release();
  state.policy = null;
  state.entry = entry ?? null;
  clearError();
  showManifest(null);
  if (!entry) {
    showError(`no model named ${JSON.stringify(name)}; available: ${state.models.map((m) => m.name).join(", ") || "none"}`);
    newGame({ gridSize: 10, actionMode: "relative" });
    markReady();
    return;
  }
  const curve = loadCurve(entry);
  setStatus(`loading ${entry.name}…`);
  const threads = Number(params.get("threads") ?? 1);
  try {
    const policy = await Policy.load(entry.model, entry.manifest, { threads });
    if (token !== loadToken) {
      policy.release();
      return;
    }
    state.policy = policy;
    showManifest(policy.manifest, entry);
    newGame(policy.settings);
    const t = policy.timings;
    api.loadTimings = t;
    setStatus(
      `${entry.name}: loaded (fetch ${t.fetchMs.toFixed(0)} ms, sha256 ${t.verifyMs.toFixed(0)} ms, ` +
        `session ${t.sessionMs.toFixed(0)} ms)`,
    );
    startLoop();
  } catch (err) {
    if (token !== loadToken) return;
    const message = err instanceof ModelError ? err.message : `unexpected error: ${err?.message ?? err}`;
    showError(`Cannot play ${entry.name}: ${message}`);
    newGame({ gridSize: 10, actionMode: "relative" });
    if (state.human) startLoop();
  }
  await curve;
  markReady();
}

// ---- the game ----------------------------------------------------------------------------------

function seedValue() {
  const value = Number.parseInt(ui.seed.value, 10);
  return Number.isFinite(value) ? value : 0;
}

function newGame(settings) {
  const random = snake.mulberry32(seedValue());
  state.game = new snake.SnakeGame({
    gridSize: settings.gridSize,
    actionMode: settings.actionMode,
    maxHunger: settings.maxHunger,
    space: settings.space,
    appleSource: snake.uniformApples(random),
  });
  state.episode = 1;
  state.best = 0;
  state.moves = 0;
  state.inferMs = [];
  state.wantDir = null;
  state.lastOutcome = null;
  state.scores = [];
  state.endedAt = null;
  state.dirty = true;
  updateStats();
}

function restart() {
  state.generation += 1;
  const settings = state.policy?.settings ?? { gridSize: state.game?.gridSize ?? 10, actionMode: "relative" };
  newGame(settings);
  if (state.policy || state.human) startLoop();
}

function speed() {
  return Number(ui.speed.value);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const channel = new MessageChannel();
const yieldQueue = [];
channel.port1.onmessage = () => yieldQueue.shift()?.();
/** Yield to the event loop without setTimeout's 4 ms clamp. */
const yieldNow = () =>
  new Promise((resolve) => {
    yieldQueue.push(resolve);
    channel.port2.postMessage(0);
  });

/** Human play waits for the first key of a game, and stops at the end of an episode. */
function humanWaits() {
  return state.game.done || (state.game.steps === 0 && state.wantDir === null);
}

async function startLoop() {
  const generation = ++state.generation;
  let lastYield = performance.now();
  while (generation === state.generation) {
    const started = performance.now();
    if (state.paused || (!state.human && !state.policy) || (state.human && humanWaits())) {
      await sleep(50);
      continue;
    }
    try {
      await tick();
    } catch (err) {
      if (generation === state.generation) showError(`the game stopped: ${err?.message ?? err}`);
      return;
    }
    const fast = speed() >= MAX_SPEED && !state.human;
    if (fast) {
      if (performance.now() - lastYield > 12) {
        await yieldNow(); // let input events and rendering through
        lastYield = performance.now();
      }
    } else {
      const wait = 1000 / speed() - (performance.now() - started);
      await sleep(Math.max(0, wait));
    }
  }
}

async function tick() {
  const game = state.game;
  if (game.done) {
    const fast = speed() >= MAX_SPEED && !state.human;
    if (!fast && performance.now() - state.endedAt < END_PAUSE_MS) return;
    game.reset();
    state.episode += 1;
    state.dirty = true;
    return;
  }
  let action;
  if (state.human) {
    action = snake.actionToward(game.dir, state.wantDir ?? game.dir, game.actionMode);
    state.wantDir = null;
  } else {
    const obs = game.observation();
    action = await state.policy.act(obs);
    state.inferMs.push(state.policy.lastMs);
    if (state.inferMs.length > 100) state.inferMs.shift();
    if (game !== state.game) return; // restarted while the model was thinking
  }
  game.step(action);
  state.moves += 1;
  countMove();
  state.best = Math.max(state.best, game.score);
  if (game.done) {
    state.scores.push(game.score);
    state.lastOutcome = game.outcome;
    state.endedAt = performance.now();
  }
  state.dirty = true;
}

// ---- stats and drawing -------------------------------------------------------------------------

let moveTimes = [];
function countMove() {
  moveTimes.push(performance.now());
}

function updateStats() {
  const game = state.game;
  if (!game) return;
  $("score").textContent = String(game.score);
  $("best").textContent = String(state.best);
  $("length").textContent = String(game.length);
  $("episode").textContent = String(state.episode);
  $("steps").textContent = String(game.steps);
  $("moves").textContent = String(state.moves);
  const mean = state.inferMs.length ? state.inferMs.reduce((a, b) => a + b, 0) / state.inferMs.length : null;
  $("infer-ms").textContent = mean === null ? "–" : `${mean.toFixed(2)} ms`;
  $("fps").textContent = state.fps ? state.fps.toFixed(0) : "–";
  $("mps").textContent = state.mps ? state.mps.toFixed(0) : "–";
  $("outcome").textContent = state.lastOutcome ?? "–";
  const recent = state.scores.slice(-100);
  $("mean-score").textContent = recent.length
    ? `${(recent.reduce((a, b) => a + b, 0) / recent.length).toFixed(1)} (${recent.length})`
    : "–";
}

function draw() {
  const game = state.game;
  const canvas = ui.board;
  const ctx = canvas.getContext("2d");
  const size = canvas.width;
  ctx.fillStyle = "#14181f";
  ctx.fillRect(0, 0, size, size);
  if (!game) return;
  const G = game.gridSize;
  const cell = size / G;
  ctx.strokeStyle = "#1f2530";
  ctx.lineWidth = 1;
  for (let i = 1; i < G; i++) {
    ctx.beginPath();
    ctx.moveTo(i * cell + 0.5, 0);
    ctx.lineTo(i * cell + 0.5, size);
    ctx.moveTo(0, i * cell + 0.5);
    ctx.lineTo(size, i * cell + 0.5);
    ctx.stroke();
  }
  if (game.apple >= 0) {
    const r = Math.floor(game.apple / G);
    const c = game.apple % G;
    ctx.fillStyle = "#f03e3e";
    ctx.beginPath();
    ctx.arc((c + 0.5) * cell, (r + 0.5) * cell, cell * 0.36, 0, 2 * Math.PI);
    ctx.fill();
  }
  const L = game.body.length;
  for (let i = L - 1; i >= 0; i--) {
    const r = Math.floor(game.body[i] / G);
    const c = game.body[i] % G;
    const shade = 0.45 + (0.55 * (L - i)) / L; // the body plane's (L-i)/L, as a brightness
    ctx.fillStyle = i === 0 ? "#8ce99a" : `rgba(64, 192, 87, ${shade})`;
    const inset = i === 0 ? 1.5 : 3;
    ctx.fillRect(c * cell + inset, r * cell + inset, cell - 2 * inset, cell - 2 * inset);
  }
  const overlay = state.error
    ? "model error (see above)"
    : game.done
      ? { death: "crashed", win: "board full: win!", truncated: "too hungry (truncated)" }[game.outcome]
      : state.paused
        ? "paused"
        : state.human && game.steps === 0 && state.wantDir === null
          ? "press an arrow key"
          : null;
  if (overlay) {
    ctx.fillStyle = "rgba(0, 0, 0, 0.55)";
    ctx.fillRect(0, size / 2 - 28, size, 56);
    ctx.fillStyle = "#fff";
    ctx.font = "bold 22px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.fillText(overlay, size / 2, size / 2 + 8);
    ctx.textAlign = "left";
  }
}

let fpsWindowStart = performance.now();
function frame(now) {
  if (state.dirty) {
    draw();
    updateStats();
    state.dirty = false;
    state.frames += 1;
    state.totalFrames += 1;
  }
  if (now - fpsWindowStart >= 1000) {
    const seconds = (now - fpsWindowStart) / 1000;
    state.fps = state.frames / seconds;
    moveTimes = moveTimes.filter((t) => t > now - 1000);
    state.mps = moveTimes.length;
    state.frames = 0;
    fpsWindowStart = now;
    updateStats();
  }
  requestAnimationFrame(frame);
}

// ---- controls ----------------------------------------------------------------------------------

const KEYS = {
  ArrowUp: snake.UP, KeyW: snake.UP,
  ArrowRight: snake.RIGHT, KeyD: snake.RIGHT,
  ArrowDown: snake.DOWN, KeyS: snake.DOWN,
  ArrowLeft: snake.LEFT, KeyA: snake.LEFT,
};

function setHuman(human) {
  state.human = human;
  ui.mode.setAttribute("aria-pressed", String(human));
  ui.mode.textContent = human ? "model play" : "human play";
  restart();
}

function speedChanged() {
  ui.speedLabel.textContent = speed() >= MAX_SPEED ? "max" : `${speed()}/s`;
}

function wireControls() {
  ui.select.addEventListener("change", () => {
    const url = new URL(location.href);
    url.searchParams.set("model", ui.select.value);
    history.replaceState(null, "", url);
    loadModel(ui.select.value);
  });
  ui.speed.addEventListener("input", speedChanged);
  ui.restart.addEventListener("click", restart);
  ui.seed.addEventListener("change", restart);
  ui.mode.addEventListener("click", () => setHuman(!state.human));
  ui.pause.addEventListener("click", () => {
    state.paused = !state.paused;
    ui.pause.setAttribute("aria-pressed", String(state.paused));
    state.dirty = true;
  });
  document.addEventListener("keydown", (event) => {
    if (event.target instanceof HTMLInputElement || event.target instanceof HTMLSelectElement) return;
    if (event.code === "Space") {
      ui.pause.click();
      event.preventDefault();
      return;
    }
    if (!state.human || !(event.code in KEYS)) return;
    event.preventDefault();
    if (state.game?.done) restart();
    state.wantDir = KEYS[event.code];
  });
}

async function main() {
  if (params.has("seed")) ui.seed.value = params.get("seed");
  if (params.has("speed")) ui.speed.value = params.get("speed") === "max" ? String(MAX_SPEED) : params.get("speed");
  speedChanged();
  ui.mode.setAttribute("aria-pressed", String(state.human));
  ui.mode.textContent = state.human ? "model play" : "human play";
  wireControls();
  requestAnimationFrame(frame);
  state.models = await listModels();
  fillPicker();
  if (state.models.length === 0) {
    showError("No model yet. Train one with `thrust-remote train snake` (it writes web/public/snake.onnx and snake.json), then reload. Human play works meanwhile.");
    newGame({ gridSize: 10, actionMode: "relative" });
    drawCurve(ui.curve, []);
    markReady();
    return;
  }
  const first = state.models.find(playable) ?? state.models[0];
  const wanted = params.get("model") ?? first.name;
  ui.select.value = wanted;
  await loadModel(wanted);
}

main();
