// What the client decides when floodgate itself cannot answer (stopped, frozen, lost
// mid-call) and which answers reject instead. The retries floodgate's own answers call for
// are in retry.test.ts. Attempts are counted through onAttemptFailed, never inferred from
// timing.
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

test("fail-open: a stopped server gives an allowed, degraded decision at once", async () => {
  const target = await stoppedServerTarget();
  // grpc-js fails the call without saying whether anything was sent, and a retry within the
  // deadline would meet the same channel in its reconnect backoff: no retry.
  const { client, failures } = recordingClient(target, { timeoutMs: 2_000, maxAttempts: 4 });
  try {
    const decision = await client.shouldRateLimit(DOMAIN, descriptors);
    assert.equal(decision.allowed, true);
    assert.equal(decision.degraded, true);
    assert.deepEqual(decision.headers, {});
    assert.deepEqual(
      decision.statuses.map((s) => [s.allowed, s.limit]),
      [[true, undefined], [true, undefined]],
    );
    assert.deepEqual(failures, [{ attempt: 1, codeName: "UNAVAILABLE" }]);
  } finally {
    client.close();
  }
});

test("fail-closed: a stopped server gives a rejected, degraded decision", async () => {
  const target = await stoppedServerTarget();
  const { client, failures } = recordingClient(target, { failureMode: "closed", maxAttempts: 4 });
  try {
    const decision = await client.shouldRateLimit(DOMAIN, descriptors);
    assert.equal(decision.allowed, false);
    assert.equal(decision.degraded, true);
    assert.deepEqual(decision.statuses.map((s) => s.allowed), [false, false]);
    assert.deepEqual(failures, [{ attempt: 1, codeName: "UNAVAILABLE" }]);
  } finally {
    client.close();
  }
});

test("a passed deadline is not retried and the failure mode decides", async () => {
  const server = await FloodgateServer.start();
  const { client, failures } = recordingClient(server.grpcTarget, {
    failureMode: "closed",
    timeoutMs: 500,
    maxAttempts: 4,
    initialBackoffMs: 1,
  });
  try {
    // Connect while the server runs, so the deadline, not the connection, is what fails.
    const warm = await client.shouldRateLimit(DOMAIN, [{ user_id: unique("frank") }]);
    assert.equal(warm.degraded, false);
    await server.freeze();
    const decision = await client.shouldRateLimit(DOMAIN, descriptors);
    assert.equal(decision.allowed, false);
    assert.equal(decision.degraded, true);
    assert.deepEqual(failures, [{ attempt: 1, codeName: "DEADLINE_EXCEEDED" }]);
  } finally {
    client.close();
    await server.stop();
  }
});

test("a connection lost after the request went out is not retried", async () => {
  const server = await FloodgateServer.start();
  const { client, failures } = recordingClient(server.grpcTarget, {
    failureMode: "closed",
    timeoutMs: 5_000,
    maxAttempts: 4,
    initialBackoffMs: 1,
  });
  try {
    const warm = await client.shouldRateLimit(DOMAIN, [{ user_id: unique("grace") }]);
    assert.equal(warm.degraded, false);
    await server.freeze();
    const call = client.shouldRateLimit(DOMAIN, descriptors);
    // The connection is open and the kernel takes the request: give it time to be written.
    await new Promise((resolve) => setTimeout(resolve, 300));
    await server.kill();
    const decision = await call;
    assert.equal(decision.allowed, false);
    assert.equal(decision.degraded, true);
    assert.deepEqual(failures, [{ attempt: 1, codeName: "UNAVAILABLE" }]);
  } finally {
    client.close();
    await server.stop();
  }
});

test("an error outside the fail-open set rejects instead of degrading", async () => {
  const server = await FloodgateServer.start();
  // floodgate's HTTP port speaks HTTP/2 too, but serves no gRPC: a 404, UNIMPLEMENTED.
  const client = new FloodgateClient(server.httpTarget, { timeoutMs: 5_000 });
  try {
    await assert.rejects(client.shouldRateLimit(DOMAIN, descriptors), (error) => {
      assert.ok(error instanceof FloodgateError);
      assert.equal(error.codeName, "UNIMPLEMENTED");
      return true;
    });
  } finally {
    client.close();
    await server.stop();
  }
});
