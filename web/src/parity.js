// Replays tests/data/snake_parity.json (recorded from trainer/envs/snake.py) on the JS engine and
// lists every difference. Used by Node's test runner and, in Chromium, by the browser tests.

import { SnakeGame } from "./snake.js";

/** A dense Float32Array from the fixture's sparse [index, value] pairs. */
export function denseObs(pairs, dim) {
  const obs = new Float32Array(dim);
  for (const [i, v] of pairs) obs[i] = v;
  return obs;
}

function diffObs(where, got, pairs, out) {
  const want = denseObs(pairs, got.length);
  for (let i = 0; i < want.length; i++) {
    if (got[i] !== want[i]) {
      out.push(`${where}: obs[${i}] is ${got[i]}, Python has ${want[i]}`);
      if (out.length > 50) return;
    }
  }
}

/** Replay one scenario; returns a list of mismatch messages (empty when JS and Python agree). */
export function replayScenario(scenario) {
  const problems = [];
  let nextApple = scenario.reset.apple;
  const game = new SnakeGame({
    gridSize: scenario.grid_size,
    actionMode: scenario.action_mode,
    maxHunger: scenario.max_hunger,
    space: scenario.space === true,
    appleSource: () => nextApple,
  });
  const name = scenario.name;
  diffObs(`${name} reset`, game.observation(), scenario.reset.obs, problems);
  if (scenario.start) {
    diffObs(`${name} start`, game.setBoard(scenario.start), scenario.start_obs, problems);
  }
  scenario.steps.forEach((want, t) => {
    if (problems.length > 50) return;
    const where = `${name} step ${t} (action ${want.action})`;
    nextApple = want.apple; // the apple Python placed this step, if it placed one
    let got;
    try {
      got = game.step(want.action);
    } catch (err) {
      problems.push(`${where}: ${err.message}`);
      return;
    }
    for (const key of ["reward", "terminated", "truncated"]) {
      if (got[key] !== want[key]) problems.push(`${where}: ${key} is ${got[key]}, Python has ${want[key]}`);
    }
    const done = got.terminated || got.truncated;
    if (done) {
      if (!want.final_obs) problems.push(`${where}: JS ended the episode, Python did not`);
      else diffObs(`${where} final`, got.obs, want.final_obs, problems);
      try {
        diffObs(`${where} after reset`, game.reset(), want.obs, problems);
      } catch (err) {
        problems.push(`${where} reset: ${err.message}`);
      }
    } else {
      diffObs(where, got.obs, want.obs, problems);
    }
    if (game.apple !== want.apple) problems.push(`${where}: apple at ${game.apple}, Python has ${want.apple}`);
  });
  return problems;
}

/** Replay every scenario: {scenarios, steps, problems}. */
export function replayFixture(fixture) {
  const problems = [];
  let steps = 0;
  for (const scenario of fixture.scenarios) {
    problems.push(...replayScenario(scenario));
    steps += scenario.steps.length;
  }
  return { scenarios: fixture.scenarios.length, steps, problems };
}
