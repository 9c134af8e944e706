// Retries and the one deadline against floodgate on a real Redis that is frozen (UNAVAILABLE
// that may have counted) or missing (UNAVAILABLE marked `floodgate-counted: none`). Attempts
// are counted by the server's own metrics, never inferred from elapsed time.
import assert from "node:assert/strict";
import { test } from "node:test";
import { FloodgateClient, type Decision, type FloodgateClientOptions } from "floodgate-client";
import { DOMAIN, FloodgateServer, RedisServer, freePort } from "./floodgate";

/**
 * floodgate's breaker opens when Redis stays silent for a window; these tests keep it shut,
 * so that every answer comes from a call to Redis.
 */
const BREAKER_SHUT = { FLOODGATE_REDIS_BREAKER_WINDOW_MS: "600000" };
const QUICK = { initialBackoffMs: 1, maxBackoffMs: 4 };

interface Setup {
  readonly server: FloodgateServer;
  stop(): Promise<void>;
}

/**
 * floodgate on a Redis that answers once and then freezes. It waits `commandTimeoutMs` for
 * Redis, or less when the caller's deadline comes first, then answers UNAVAILABLE without
 * the marker: its script may have run.
 */
async function frozenRedis(commandTimeoutMs: number): Promise<Setup> {
  const redis = await RedisServer.start();
  const server = await FloodgateServer.start(["--backend", "redis", "--redis-url", redis.url], {
    FLOODGATE_REDIS_COMMAND_TIMEOUT_MS: String(commandTimeoutMs),
    ...BREAKER_SHUT,
  });
  const warm = new FloodgateClient(server.grpcTarget, { timeoutMs: 5_000 });
  const answer = await warm.shouldRateLimit(DOMAIN, [{ user_id: "warm" }]);
  warm.close();
  assert.equal(answer.degraded, false, "floodgate answers while Redis runs");
  await redis.freeze();
  return {
    server,
    stop: async () => {
      await server.stop();
      await redis.stop();
    },
  };
}

/** floodgate pointed at a port where no Redis listens: every UNAVAILABLE is marked. */
async function noRedis(): Promise<Setup> {
  const url = `redis://127.0.0.1:${await freePort()}`;
  const args = ["--backend", "redis", "--redis-url", url];
  const server = await FloodgateServer.start(args, BREAKER_SHUT);
  return { server, stop: () => server.stop() };
}

/** One call through a fresh client; returns the decision and the attempts floodgate answered. */
async function ask(
  setup: Setup,
  options: FloodgateClientOptions,
): Promise<{ decision: Decision; attempts: number }> {
  const client = new FloodgateClient(setup.server.grpcTarget, options);
  try {
    const decision = await client.shouldRateLimit(DOMAIN, [{ user_id: "alice" }]);
    return { decision, attempts: await setup.server.requestsAnswered("UNAVAILABLE") };
  } finally {
    client.close();
    await setup.stop();
  }
}

function assertFailedOpen(decision: Decision): void {
  assert.equal(decision.allowed, true, "the failure mode (open) decides");
  assert.equal(decision.degraded, true);
}

test("an UNAVAILABLE that may have counted is sent once", async () => {
  const { decision, attempts } = await ask(await frozenRedis(200), {
    timeoutMs: 5_000,
    maxAttempts: 4,
    ...QUICK,
  });
  assertFailedOpen(decision);
  assert.equal(attempts, 1);
});

test("an UNAVAILABLE that counted nothing is retried up to maxAttempts", async () => {
  const { decision, attempts } = await ask(await noRedis(), {
    timeoutMs: 5_000,
    failureMode: "closed",
    maxAttempts: 4,
    ...QUICK,
  });
  assert.equal(decision.allowed, false, "failed closed");
  assert.equal(decision.degraded, true);
  assert.equal(attempts, 4);
});

test("maxAttempts 1 sends a marked UNAVAILABLE once", async () => {
  const { decision, attempts } = await ask(await noRedis(), { timeoutMs: 5_000, maxAttempts: 1 });
  assertFailedOpen(decision);
  assert.equal(attempts, 1);
});

test("retryPossiblyCounted retries an unmarked UNAVAILABLE too, by gRPC's policy", async () => {
  const { decision, attempts } = await ask(await frozenRedis(200), {
    timeoutMs: 5_000,
    maxAttempts: 3,
    retryPossiblyCounted: true,
    ...QUICK,
  });
  assertFailedOpen(decision);
  assert.equal(attempts, 3);
});

// floodgate waits for the frozen Redis until most of what the caller has left (80%), then
// answers UNAVAILABLE. Attempts with a timeout each would make all five; under one deadline
// each gets what the ones before it left, so about one fits: another needs a pause shorter
// than the 200 ms left, and grpc-js's pauses stay within 20% of a second.
test("one deadline covers every attempt of gRPC's retry policy", async () => {
  const { decision, attempts } = await ask(await frozenRedis(60_000), {
    timeoutMs: 1_000,
    maxAttempts: 5,
    initialBackoffMs: 1_000,
    maxBackoffMs: 1_000,
    retryPossiblyCounted: true,
  });
  assertFailedOpen(decision);
  assert.ok(attempts >= 1 && attempts < 5, `${attempts} attempts: the deadline ends the call`);
});

// Marked answers come at once; the waits between them (up to 10 s each) are what the
// one-second deadline must cut short. Five attempts would need four waits adding up to under
// a second (about one chance in 240,000).
test("one deadline covers the client's own retries of marked answers", async () => {
  const { decision, attempts } = await ask(await noRedis(), {
    timeoutMs: 1_000,
    maxAttempts: 5,
    initialBackoffMs: 10_000,
    maxBackoffMs: 10_000,
  });
  assertFailedOpen(decision);
  assert.ok(attempts >= 1 && attempts < 5, `${attempts} attempts: the deadline ends the call`);
});
