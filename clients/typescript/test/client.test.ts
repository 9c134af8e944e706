// FloodgateClient against a real floodgate serving test/rules with IETF headers.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { FloodgateClient, FloodgateError } from "floodgate-client";
import { DOMAIN, FloodgateServer, unique } from "./floodgate";

let server: FloodgateServer;
let client: FloodgateClient;

before(async () => {
  server = await FloodgateServer.start(["--response-headers", "ietf"]);
  // A generous deadline: these tests are about answers, not about a busy test machine.
  client = new FloodgateClient(server.grpcTarget, { timeoutMs: 2_000 });
});

after(async () => {
  client?.close();
  await server?.stop();
});

test("requests within the limit are allowed and the one past it is rejected", async () => {
  const user = { user_id: unique("alice") };
  for (let i = 0; i < 3; i++) {
    const decision = await client.shouldRateLimit(DOMAIN, [user]);
    assert.equal(decision.allowed, true, `request ${i + 1}`);
    assert.equal(decision.degraded, false);
  }
  const rejected = await client.shouldRateLimit(DOMAIN, [user]);
  assert.equal(rejected.allowed, false);
  assert.equal(rejected.statuses[0]?.allowed, false);
  assert.equal(rejected.degraded, false);
});

test("each status reports the limit, the remaining quota and the time to reset", async () => {
  const user = { user_id: unique("bob") };
  const remaining: number[] = [];
  for (let i = 0; i < 3; i++) {
    const [status] = (await client.shouldRateLimit(DOMAIN, [user])).statuses;
    assert.ok(status);
    assert.deepEqual(status.limit, {
      requestsPerUnit: 3,
      unit: "minute",
      unitMultiplier: 1,
      name: "user_per_minute",
    });
    assert.ok(status.resetSeconds > 0 && status.resetSeconds <= 60, `${status.resetSeconds}`);
    remaining.push(status.remaining);
  }
  assert.deepEqual(remaining, [2, 1, 0]);
});

test("several descriptors get one status each, in request order", async () => {
  const decision = await client.shouldRateLimit(DOMAIN, [
    { user_id: unique("carol") },
    [["path", "/a"], ["method", "GET"]],
    [["method", "GET"], ["path", "/a"]], // the same entries in another order match nothing
  ]);
  assert.equal(decision.allowed, true);
  assert.deepEqual(
    decision.statuses.map((s) => [s.limit?.requestsPerUnit, s.limit?.unit]),
    [[3, "minute"], [5, "hour"], [undefined, undefined]],
  );
});

test("hits above one take that many from the quota, and a rejected request takes none", async () => {
  const tenant = { tenant: unique("acme") };
  const first = await client.shouldRateLimit(DOMAIN, [tenant], 4);
  assert.equal(first.allowed, true);
  assert.equal(first.statuses[0]?.remaining, 6);
  assert.equal(first.statuses[0]?.limit?.unitMultiplier, 5);

  const tooCostly = await client.shouldRateLimit(DOMAIN, [tenant], 7);
  assert.equal(tooCostly.allowed, false);
  const after = await client.shouldRateLimit(DOMAIN, [tenant], 6);
  assert.equal(after.allowed, true);
  assert.equal(after.statuses[0]?.remaining, 0);
});

test("headers carry floodgate's RateLimit fields, and Retry-After once over the limit", async () => {
  const user = { user_id: unique("dave") };
  const allowed = await client.shouldRateLimit(DOMAIN, [user], 3);
  assert.match(allowed.headers["ratelimit-policy"] ?? "", /q=3;w=60/);
  assert.match(allowed.headers["ratelimit"] ?? "", /r=0;t=\d+/);
  assert.equal(allowed.headers["retry-after"], undefined);

  const rejected = await client.shouldRateLimit(DOMAIN, [user]);
  assert.match(rejected.headers["retry-after"] ?? "", /^\d+$/);
});

test("an empty domain rejects with a FloodgateError carrying the server's message, untried again", async () => {
  let attempts = 0;
  const counting = new FloodgateClient(server.grpcTarget, {
    timeoutMs: 2_000,
    onAttemptFailed: () => attempts++,
  });
  try {
    await assert.rejects(counting.shouldRateLimit("", [{ user_id: "x" }]), (error) => {
      assert.ok(error instanceof FloodgateError);
      assert.equal(error.codeName, "INVALID_ARGUMENT");
      assert.match(error.details, /domain/);
      assert.ok(error.message.includes(error.details));
      return true;
    });
    assert.equal(attempts, 1);
  } finally {
    counting.close();
  }
});

test("a closed client rejects calls instead of deciding by its failure mode", async () => {
  const closed = new FloodgateClient(server.grpcTarget);
  closed.close();
  await assert.rejects(closed.shouldRateLimit(DOMAIN, [{ user_id: "x" }]), (error) => {
    assert.ok(error instanceof FloodgateError);
    assert.equal(error.codeName, "CANCELLED");
    return true;
  });
});

test("invalid hits and options are refused before anything is sent", async () => {
  await assert.rejects(client.shouldRateLimit(DOMAIN, [{ user_id: "x" }], -1), RangeError);
  await assert.rejects(client.shouldRateLimit(DOMAIN, [{ user_id: "x" }], 1.5), RangeError);
  assert.throws(() => new FloodgateClient(server.grpcTarget, { timeoutMs: 0 }), RangeError);
  for (const maxAttempts of [0, 6, 2.5]) {
    assert.throws(() => new FloodgateClient(server.grpcTarget, { maxAttempts }), RangeError);
  }
  assert.throws(() => new FloodgateClient(server.grpcTarget, { initialBackoffMs: 0 }), RangeError);
  assert.throws(
    () => new FloodgateClient(server.grpcTarget, { initialBackoffMs: 5, maxBackoffMs: 4 }),
    RangeError,
  );
});
