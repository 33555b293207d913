// node --test tests/js/ : the JS Snake engine against docs/snake.md and the Python parity fixture.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

import { replayFixture, replayScenario } from "../../web/src/parity.js";
import { SnakeGame, actionToward, mulberry32, obsDim, uniformApples } from "../../web/src/snake.js";

const fixture = JSON.parse(readFileSync(new URL("../data/snake_parity.json", import.meta.url), "utf8"));

for (const scenario of fixture.scenarios) {
  test(`parity with trainer/envs/snake.py: ${scenario.name}`, () => {
    const problems = replayScenario(scenario);
    assert.deepEqual(problems.slice(0, 10), [], `${problems.length} mismatches`);
  });
}

test("the fixture covers eating, death, truncation and a win", () => {
  const steps = fixture.scenarios.flatMap((s) => s.steps);
  assert.ok(steps.some((s) => s.reward === 1 && !s.terminated), "an apple");
  assert.ok(steps.some((s) => s.reward === -1 && s.terminated), "a death");
  assert.ok(steps.some((s) => s.truncated), "a truncation");
  assert.ok(steps.some((s) => s.reward === 1 && s.terminated), "a win");
  assert.ok(fixture.scenarios.some((s) => s.action_mode === "absolute"), "absolute actions");
  const { problems } = replayFixture(fixture);
  assert.equal(problems.length, 0);
});

test("start: length 3 in the middle heading right, observation layout", () => {
  const game = new SnakeGame({ gridSize: 10, appleSource: () => 0 });
  const obs = game.observation();
  assert.equal(obs.length, obsDim(10));
  assert.deepEqual(game.body, [55, 54, 53]);
  assert.equal(obs[55], 1); // head plane
  assert.equal(obs[100 + 55], 1); // body plane: (L - 0) / L
  assert.equal(obs[100 + 53], Math.fround(1 / 3)); // tail: 1/L
  assert.equal(obs[200 + 0], 1); // apple plane
  assert.deepEqual(Array.from(obs.slice(300)), [0, 1, 0, 0, 0, 0, 0, 0]);
  // with the space features: every move keeps the whole board in reach
  const spaced = new SnakeGame({ gridSize: 10, space: true, appleSource: () => 0 }).observation();
  assert.equal(spaced.length, obsDim(10, true));
  assert.deepEqual(Array.from(spaced.slice(300)), [0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1]);
});

test("space: a move into a closed pocket reads its size, a deadly move 0", () => {
  // 6x6, length 25, heading left from (1,2): straight enters the pocket (0,0),(0,1),(1,0),(1,1), whose
  // body walls have counters of 14 and more, so none opens within the 12 moves of look-ahead; left
  // (down) and right (up) are the body.
  const game = new SnakeGame({ gridSize: 6, space: true, appleSource: () => 35 });
  const body = [[1, 2], [0, 2], [0, 3], [0, 4], [0, 5], [1, 5], [1, 4], [1, 3], [2, 3], [2, 2], [2, 1], [2, 0],
    [3, 0], [3, 1], [3, 2], [3, 3], [3, 4], [3, 5], [4, 5], [4, 4], [4, 3], [4, 2], [4, 1], [4, 0], [5, 0]];
  const obs = game.setBoard({ body, direction: 3, apple: [5, 5] });
  assert.deepEqual(Array.from(obs.slice(3 * 36 + 8)), [Math.fround(4 / 36), 0, 0]);
});

test("relative turns and the wall", () => {
  const game = new SnakeGame({ gridSize: 4, appleSource: (empty) => empty[empty.length - 1] });
  // head (2,2) heading right: straight to (2,3), then the wall
  assert.equal(game.step(0).reward, 0);
  const end = game.step(0);
  assert.equal(end.terminated, true);
  assert.equal(end.reward, -1);
  assert.throws(() => game.step(0), /reset/);
});

test("the keyboard maps to relative actions, a reverse is straight", () => {
  assert.equal(actionToward(1, 1, "relative"), 0);
  assert.equal(actionToward(1, 0, "relative"), 1);
  assert.equal(actionToward(1, 2, "relative"), 2);
  assert.equal(actionToward(1, 3, "relative"), 0);
  assert.equal(actionToward(1, 3, "absolute"), 3);
});

test("a seeded game repeats itself", () => {
  const play = () => {
    const game = new SnakeGame({ appleSource: uniformApples(mulberry32(42)) });
    return [game.apple, game.step(1), game.step(2)].map((x) => JSON.stringify(x));
  };
  assert.deepEqual(play(), play());
});
