// The failure modes, against a floodgate that was running and then stopped or frozen.
// Retries are counted through onAttemptFailed, never inferred from timing.
import assert from "node:assert/strict";
import { test } from "node:test";
import { FloodgateClient, FloodgateError, type FloodgateClientOptions } from "floodgate-client";
import { DOMAIN, FloodgateServer, unique } from "./floodgate";

interface Attempt {
  readonly attempt: number;
  readonly codeName: string;
}

/** A client that records every failed attempt. */
function recordingClient(
  target: string,
  options: FloodgateClientOptions,
): { client: FloodgateClient; failures: Attempt[] } {
  const failures: Attempt[] = [];
  const client = new FloodgateClient(target, {
    ...options,
    onAttemptFailed: (error: FloodgateError, attempt: number) => {
      failures.push({ attempt, codeName: error.codeName });
    },
  });
  return { client, failures };
}

/** The gRPC address of a floodgate that answered once and has since stopped. */
async function stoppedServerTarget(): Promise<string> {
  const server = await FloodgateServer.start();
  const probe = new FloodgateClient(server.grpcTarget, { timeoutMs: 2_000 });
  const answer = await probe.shouldRateLimit(DOMAIN, [{ user_id: unique("probe") }]);
  assert.equal(answer.degraded, false, "the server answered while it ran");
  probe.close();
  await server.stop();
  return server.grpcTarget;
}

const descriptors = [{ user_id: "erin" }, [["path", "/a"], ["method", "GET"]] as const];

test("by default (fail-open, two retries) a stopped server gives an allowed, degraded decision", async () => {
  const target = await stoppedServerTarget();
  // Only the deadline is raised, so a busy machine cannot turn UNAVAILABLE into a timeout.
  const { client, failures } = recordingClient(target, { timeoutMs: 2_000 });
  try {
    const decision = await client.shouldRateLimit(DOMAIN, descriptors);
    assert.equal(decision.allowed, true);
    assert.equal(decision.degraded, true);
    assert.deepEqual(decision.headers, {});
    assert.deepEqual(
      decision.statuses.map((s) => [s.allowed, s.limit]),
      [[true, undefined], [true, undefined]],
    );
    assert.deepEqual(failures, [
      { attempt: 1, codeName: "UNAVAILABLE" },
      { attempt: 2, codeName: "UNAVAILABLE" },
      { attempt: 3, codeName: "UNAVAILABLE" },
    ]);
  } finally {
    client.close();
  }
});

test("fail-closed: a stopped server gives a rejected, degraded decision after every retry", async () => {
  const target = await stoppedServerTarget();
  const { client, failures } = recordingClient(target, {
    failureMode: "closed",
    retries: 4,
    backoffMs: 1,
  });
  try {
    const decision = await client.shouldRateLimit(DOMAIN, descriptors);
    assert.equal(decision.allowed, false);
    assert.equal(decision.degraded, true);
    assert.deepEqual(decision.statuses.map((s) => s.allowed), [false, false]);
    assert.equal(failures.length, 5);
    assert.ok(failures.every((f) => f.codeName === "UNAVAILABLE"));
  } finally {
    client.close();
  }
});

test("a frozen server exceeds the deadline once, without retries, and the failure mode decides", async () => {
  const server = await FloodgateServer.start();
  const { client, failures } = recordingClient(server.grpcTarget, {
    failureMode: "closed",
    timeoutMs: 500,
    retries: 3,
    backoffMs: 1,
  });
  try {
    // Connect while the server runs, so the deadline, not the connection, is what fails.
    const warm = await client.shouldRateLimit(DOMAIN, [{ user_id: unique("frank") }]);
    assert.equal(warm.degraded, false);
    server.freeze();
    const decision = await client.shouldRateLimit(DOMAIN, descriptors);
    assert.equal(decision.allowed, false);
    assert.equal(decision.degraded, true);
    assert.deepEqual(failures, [{ attempt: 1, codeName: "DEADLINE_EXCEEDED" }]);
  } finally {
    client.close();
    await server.stop();
  }
});
