// Loading a policy: manifest checks, sha256 of the model bytes, an onnxruntime-web session,
// and one inference per move. Every failure is a ModelError with a message meant for the page.

import * as ort from "../node_modules/onnxruntime-web/dist/ort.wasm.min.mjs";
import { nActions, obsDim } from "./snake.js";

const DIST = new URL("../node_modules/onnxruntime-web/dist/", import.meta.url).href;
ort.env.wasm.wasmPaths = DIST; // served locally, never a CDN

export class ModelError extends Error {}

/** Hex sha256 of an ArrayBuffer (crypto.subtle: needs a secure context such as 127.0.0.1). */
export async function sha256Hex(buffer) {
  if (!globalThis.crypto?.subtle) {
    throw new ModelError("cannot verify the model: crypto.subtle is unavailable (open the page via http://127.0.0.1)");
  }
  const digest = await crypto.subtle.digest("SHA-256", buffer);
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

async function fetchOk(url, what) {
  let response;
  try {
    response = await fetch(url, { cache: "no-store" });
  } catch (err) {
    throw new ModelError(`could not fetch the ${what} ${url}: ${err.message}`);
  }
  if (!response.ok) throw new ModelError(`could not fetch the ${what} ${url}: HTTP ${response.status}`);
  return response;
}

/** The manifest's game settings, checked for consistency; throws ModelError. */
export function gameSettings(manifest) {
  if (manifest.env !== undefined && manifest.env !== "snake") {
    throw new ModelError(`this model was trained on ${JSON.stringify(manifest.env)}; the page plays snake only`);
  }
  const gridSize = manifest.grid_size;
  if (!Number.isInteger(gridSize) || gridSize < 4) {
    throw new ModelError(`manifest: grid_size must be an integer >= 4, got ${JSON.stringify(gridSize)}`);
  }
  const actionMode = manifest.action_mode ?? "relative";
  let n;
  try {
    n = nActions(actionMode);
  } catch (err) {
    throw new ModelError(`manifest: ${err.message}`);
  }
  const space = manifest.space === true;
  const dim = obsDim(gridSize, space);
  if (manifest.obs_dim !== undefined && manifest.obs_dim !== dim) {
    const formula = space ? "3*G*G+11 with space" : "3*G*G+8";
    throw new ModelError(`manifest: obs_dim ${manifest.obs_dim} does not match grid_size ${gridSize} (${formula} = ${dim})`);
  }
  if (manifest.n_actions !== undefined && manifest.n_actions !== n) {
    throw new ModelError(`manifest: n_actions ${manifest.n_actions} does not match action_mode ${actionMode} (${n})`);
  }
  return { gridSize, actionMode, space, obsDim: dim, nActions: n, maxHunger: manifest.max_hunger ?? undefined };
}

function describeShape(dims) {
  return `[${dims.map((d) => (typeof d === "number" ? d : JSON.stringify(d))).join(", ")}]`;
}

export class Policy {
  constructor(session, manifest, settings, timings) {
    this.session = session;
    this.manifest = manifest;
    this.settings = settings;
    this.timings = timings; // {fetchMs, verifyMs, sessionMs}
    this.inputName = manifest.inputs?.[0]?.name ?? "obs";
    this.logitsName = "logits";
    this.lastMs = 0;
  }

  /**
   * Load and verify: manifest fields, byte count and sha256, the session, and the model's input
   * shape against the observation size (a dry run with zeros). Throws ModelError.
   */
  static async load(modelUrl, manifestUrl, { threads = 1 } = {}) {
    const t0 = performance.now();
    let manifest;
    try {
      manifest = await (await fetchOk(manifestUrl, "manifest")).json();
    } catch (err) {
      if (err instanceof ModelError) throw err;
      throw new ModelError(`manifest ${manifestUrl} is not valid JSON: ${err.message}`);
    }
    const settings = gameSettings(manifest);
    const bytes = await (await fetchOk(modelUrl, "model")).arrayBuffer();
    const t1 = performance.now();
    if (manifest.bytes !== undefined && manifest.bytes !== bytes.byteLength) {
      throw new ModelError(`model ${modelUrl} has ${bytes.byteLength} bytes, the manifest says ${manifest.bytes}`);
    }
    if (!manifest.sha256) throw new ModelError("manifest has no sha256: the model cannot be verified");
    const digest = await sha256Hex(bytes);
    if (digest !== String(manifest.sha256).toLowerCase()) {
      throw new ModelError(
        `sha256 mismatch: the model ${modelUrl} hashes to ${digest}, the manifest says ${manifest.sha256}. ` +
          "The files do not belong together: export or fetch them again.",
      );
    }
    const t2 = performance.now();
    ort.env.wasm.numThreads = globalThis.crossOriginIsolated ? Math.max(1, threads) : 1;
    let session;
    try {
      session = await ort.InferenceSession.create(new Uint8Array(bytes), { executionProviders: ["wasm"] });
    } catch (err) {
      throw new ModelError(`onnxruntime-web could not load ${modelUrl}: ${err.message ?? err}`);
    }
    const t3 = performance.now();
    const policy = new Policy(session, manifest, settings, {
      fetchMs: t1 - t0,
      verifyMs: t2 - t1,
      sessionMs: t3 - t2,
    });
    await policy.checkShapes();
    return policy;
  }

  /** The model must take obs [batch, obs_dim] and give logits [batch, n_actions]. */
  async checkShapes() {
    const { obsDim: dim, nActions: n } = this.settings;
    if (!this.session.inputNames.includes(this.inputName)) {
      throw new ModelError(`model has inputs ${this.session.inputNames.join(", ")}, expected "${this.inputName}"`);
    }
    if (!this.session.outputNames.includes(this.logitsName)) {
      throw new ModelError(`model has outputs ${this.session.outputNames.join(", ")}, expected "logits"`);
    }
    const meta = this.session.inputMetadata?.find?.((m) => m.name === this.inputName);
    if (meta?.isTensor && Array.isArray(meta.shape)) {
      const last = meta.shape[meta.shape.length - 1];
      if (meta.shape.length !== 2 || (typeof last === "number" && last !== dim)) {
        throw new ModelError(
          `model input "${this.inputName}" has shape ${describeShape(meta.shape)}, but the observation is ` +
            `[batch, ${dim}] (grid ${this.settings.gridSize}x${this.settings.gridSize}: 3*G*G+${dim - 3 * this.settings.gridSize ** 2})`,
        );
      }
    }
    let logits;
    try {
      logits = await this.logits(new Float32Array(dim));
    } catch (err) {
      throw new ModelError(`model rejects an observation of shape [1, ${dim}]: ${err.message ?? err}`);
    }
    if (logits.length !== n) {
      throw new ModelError(`model gives ${logits.length} logits, the action mode ${this.settings.actionMode} has ${n} actions`);
    }
  }

  /** Raw outputs for a batch of observations (Float32Array of batch*obs_dim): {logits, value}. */
  async run(obs, batch = 1) {
    const input = new ort.Tensor("float32", obs, [batch, this.settings.obsDim]);
    const t0 = performance.now();
    const out = await this.session.run({ [this.inputName]: input });
    this.lastMs = performance.now() - t0;
    return { logits: out.logits.data, value: out.value ? out.value.data : null };
  }

  async logits(obs) {
    return (await this.run(obs, 1)).logits;
  }

  /** argmax of the logits (the first maximum on ties, as torch.argmax). */
  async act(obs) {
    const logits = await this.logits(obs);
    let best = 0;
    for (let i = 1; i < logits.length; i++) if (logits[i] > logits[best]) best = i;
    return best;
  }

  release() {
    this.session?.release?.();
  }
}
