// Snake, rule for rule as docs/snake.md says (the contract shared with trainer/envs/snake.py).
// One game, plain JavaScript, no DOM: the page and Node's test runner import the same module.

export const UP = 0;
export const RIGHT = 1;
export const DOWN = 2;
export const LEFT = 3;
const DELTA = [[-1, 0], [0, 1], [1, 0], [0, -1]]; // (drow, dcol) for up, right, down, left

/** Observation length for a G x G board: three G*G planes and 8 features, 11 with the space ones. */
export function obsDim(gridSize, space = false) {
  return 3 * gridSize * gridSize + (space ? 11 : 8);
}

/** Moves of look-ahead of the space features (docs/snake.md). */
export function spaceDepth(gridSize) {
  return 2 * gridSize;
}

/** Number of actions for an action mode: 3 (relative) or 4 (absolute). */
export function nActions(actionMode) {
  if (actionMode === "relative") return 3;
  if (actionMode === "absolute") return 4;
  throw new Error(`unknown action_mode ${JSON.stringify(actionMode)} (expected "relative" or "absolute")`);
}

/** A small seeded PRNG (mulberry32): uniform floats in [0, 1). */
export function mulberry32(seed) {
  let a = seed >>> 0;
  return function random() {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** An apple source from a random() function: a uniform pick among the empty cells. */
export function uniformApples(random) {
  return (emptyCells) => emptyCells[Math.floor(random() * emptyCells.length)];
}

/**
 * The action that turns a snake heading `dir` towards the absolute direction `want`
 * (for the keyboard): in relative mode straight / left / right; the reverse means straight.
 */
export function actionToward(dir, want, actionMode) {
  if (actionMode === "absolute") return want;
  if (want === (dir + 3) % 4) return 1;
  if (want === (dir + 1) % 4) return 2;
  return 0;
}

export class SnakeGame {
  /**
   * @param {object} options
   * @param {number} [options.gridSize=10]  G, at least 4
   * @param {string} [options.actionMode="relative"]  "relative" (3 actions) or "absolute" (4)
   * @param {number} [options.maxHunger=G*G]  steps without an apple before truncation
   * @param {boolean} [options.space=false]  the three space features at the end of the observation
   * @param {(emptyCells: number[]) => number} [options.appleSource]  picks the apple's flat index
   *   among the empty cells (sorted ascending); the default is uniform with Math.random.
   */
  constructor({ gridSize = 10, actionMode = "relative", maxHunger, space = false, appleSource } = {}) {
    if (!Number.isInteger(gridSize) || gridSize < 4) throw new Error(`grid size must be an integer >= 4, got ${gridSize}`);
    this.gridSize = gridSize;
    this.actionMode = actionMode;
    this.nActions = nActions(actionMode);
    this.maxHunger = maxHunger ?? gridSize * gridSize;
    this.appleSource = appleSource ?? uniformApples(Math.random);
    this.space = space;
    this.obsDim = obsDim(gridSize, space);
    this.reset();
  }

  /** Start an episode (length 3 in the middle, heading right, one apple); returns the observation. */
  reset() {
    const G = this.gridSize;
    const r = G >> 1;
    const c = G >> 1;
    this.body = [r * G + c, r * G + c - 1, r * G + c - 2]; // flat indices, head first
    this.dir = RIGHT;
    this.hunger = 0;
    this.score = 0;
    this.steps = 0;
    this.done = false;
    this.outcome = null; // "death" | "win" | "truncated" once the episode ends
    this.apple = -1;
    this.placeApple();
    return this.observation();
  }

  /**
   * A hand-built state (for fixtures and tests): body as [[row, col], ...] head first, direction,
   * apple [row, col] or null, hunger. Returns the observation.
   */
  setBoard({ body, direction, apple, hunger = 0 }) {
    const G = this.gridSize;
    const cells = body.map(([r, c]) => {
      if (r < 0 || r >= G || c < 0 || c >= G) throw new Error(`body cell (${r}, ${c}) is off the board`);
      return r * G + c;
    });
    if (new Set(cells).size !== cells.length) throw new Error("body cells repeat");
    this.body = cells;
    this.dir = direction;
    this.hunger = hunger;
    this.apple = apple ? apple[0] * G + apple[1] : -1;
    if (this.apple >= 0 && cells.includes(this.apple)) throw new Error("the apple is on the body");
    this.done = false;
    this.outcome = null;
    return this.observation();
  }

  get length() {
    return this.body.length;
  }

  get head() {
    return this.body[0];
  }

  /** Flat indices of the empty cells, ascending. */
  emptyCells() {
    const occupied = new Uint8Array(this.gridSize * this.gridSize);
    for (const cell of this.body) occupied[cell] = 1;
    const empty = [];
    for (let i = 0; i < occupied.length; i++) if (!occupied[i]) empty.push(i);
    return empty;
  }

  placeApple() {
    const empty = this.emptyCells();
    const cell = this.appleSource(empty);
    if (!empty.includes(cell)) throw new Error(`apple source chose cell ${cell}, which is not empty`);
    this.apple = cell;
  }

  /** The direction after an action from direction `dir`. */
  turn(dir, action) {
    if (this.actionMode === "relative") {
      if (action === 0) return dir;
      if (action === 1) return (dir + 3) % 4;
      if (action === 2) return (dir + 1) % 4;
    } else if (action >= 0 && action <= 3) {
      return action === (dir + 2) % 4 ? dir : action;
    }
    throw new Error(`invalid action ${action} for action_mode ${this.actionMode}`);
  }

  /** The cell one step from the head in direction `dir`, or -1 outside the grid. */
  nextCell(dir) {
    const G = this.gridSize;
    const row = Math.floor(this.head / G) + DELTA[dir][0];
    const col = (this.head % G) + DELTA[dir][1];
    if (row < 0 || row >= G || col < 0 || col >= G) return -1;
    return row * G + col;
  }

  /** Death rule: outside the grid, or a body cell other than the current tail. */
  isDeadly(cell) {
    if (cell < 0) return true;
    const tail = this.body.length - 1;
    for (let i = 0; i < tail; i++) if (this.body[i] === cell) return true;
    return false;
  }

  /**
   * One move. Returns {obs, reward, terminated, truncated}; after the episode ends the game stays
   * in its final state (obs is the final observation) until reset().
   */
  step(action) {
    if (this.done) throw new Error("the episode is over: call reset()");
    this.dir = this.turn(this.dir, action);
    const cell = this.nextCell(this.dir);
    let reward = 0;
    let terminated = false;
    let truncated = false;
    this.steps += 1;
    if (this.isDeadly(cell)) {
      reward = -1;
      terminated = true;
      this.outcome = "death";
    } else if (cell === this.apple) {
      this.body.unshift(cell);
      reward = 1;
      this.score += 1;
      this.hunger = 0;
      if (this.body.length === this.gridSize * this.gridSize) {
        terminated = true;
        this.apple = -1;
        this.outcome = "win";
      } else {
        this.placeApple();
      }
    } else {
      this.body.unshift(cell);
      this.body.pop();
      this.hunger += 1;
      if (this.hunger >= this.maxHunger) {
        truncated = true;
        this.outcome = "truncated";
      }
    }
    this.done = terminated || truncated;
    return { obs: this.observation(), reward, terminated, truncated };
  }

  /**
   * The space feature of a move into `cell`: the share of the board reached within spaceDepth(G)
   * moves, a cell being reached at move d when it neighbours a cell reached before and its body
   * counter (L - i for body[i], 0 when empty) is <= d; 0 for a deadly move (docs/snake.md).
   */
  spaceOf(cell) {
    if (this.isDeadly(cell)) return 0;
    const G = this.gridSize;
    const N = G * G;
    const L = this.body.length;
    const counter = new Int32Array(N);
    for (let i = 0; i < L; i++) counter[this.body[i]] = L - i;
    const reached = new Uint8Array(N);
    reached[cell] = 1;
    let count = 1;
    const fresh = [];
    for (let d = 2; d <= spaceDepth(G); d++) {
      fresh.length = 0;
      for (let c = 0; c < N; c++) {
        if (reached[c] || counter[c] > d) continue;
        const row = Math.floor(c / G);
        const col = c % G;
        if ((row > 0 && reached[c - G]) || (row < G - 1 && reached[c + G]) ||
            (col > 0 && reached[c - 1]) || (col < G - 1 && reached[c + 1])) fresh.push(c);
      }
      for (const c of fresh) reached[c] = 1; // reached at move d: they grow the set from move d + 1
      count += fresh.length;
    }
    return count / N;
  }

  /**
   * float32[3*G*G + 8]: head plane, body plane ((L-i)/L), apple plane, direction, danger, hunger;
   * with `space`, 3 more: space (straight, left, right).
   */
  observation(out) {
    const G = this.gridSize;
    const N = G * G;
    const obs = out ?? new Float32Array(this.obsDim);
    obs.fill(0);
    const L = this.body.length;
    obs[this.head] = 1;
    for (let i = 0; i < L; i++) obs[N + this.body[i]] = (L - i) / L;
    if (this.apple >= 0) obs[2 * N + this.apple] = 1;
    const f = 3 * N;
    obs[f + this.dir] = 1;
    obs[f + 4] = this.isDeadly(this.nextCell(this.dir)) ? 1 : 0;
    obs[f + 5] = this.isDeadly(this.nextCell((this.dir + 3) % 4)) ? 1 : 0;
    obs[f + 6] = this.isDeadly(this.nextCell((this.dir + 1) % 4)) ? 1 : 0;
    obs[f + 7] = this.hunger / this.maxHunger;
    if (this.space) {
      obs[f + 8] = this.spaceOf(this.nextCell(this.dir));
      obs[f + 9] = this.spaceOf(this.nextCell((this.dir + 3) % 4));
      obs[f + 10] = this.spaceOf(this.nextCell((this.dir + 1) % 4));
    }
    return obs;
  }
}
