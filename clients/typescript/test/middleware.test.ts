// The middleware in real HTTP servers (node:http and Express) answering real requests.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import express from "express";
import { FloodgateClient, rateLimit, type NextFunction } from "floodgate-client";
import { DOMAIN, FloodgateServer, unique } from "./floodgate";

let floodgate: FloodgateServer;
let client: FloodgateClient;

before(async () => {
  floodgate = await FloodgateServer.start(["--response-headers", "ietf"]);
  client = new FloodgateClient(floodgate.grpcTarget, { timeoutMs: 2_000 });
});

after(async () => {
  client?.close();
  await floodgate?.stop();
});

/** One limit per `x-client` header; requests without it are not limited. */
function limitByClient(limiter: FloodgateClient, domain = DOMAIN) {
  return rateLimit({
    client: limiter,
    domain,
    descriptors: (req) => {
      const id = req.headers["x-client"];
      return typeof id === "string" ? [{ client: id }] : undefined;
    },
  });
}

/** A node:http server: the middleware, then "hello"; an error passed to next becomes a 500. */
async function serveWithNodeHttp(
  middleware: (req: IncomingMessage, res: ServerResponse, next: NextFunction) => void,
): Promise<{ url: string; server: Server }> {
  const server = createServer((req, res) => {
    middleware(req, res, (error) => {
      res.statusCode = error === undefined ? 200 : 500;
      res.end(error === undefined ? "hello" : `error: ${String(error)}`);
    });
  });
  return { url: await listen(server), server };
}

async function listen(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
}

function close(server: Server): Promise<void> {
  server.closeAllConnections();
  return new Promise((resolve) => server.close(() => resolve()));
}

test("allowed requests reach the handler with floodgate's RateLimit headers", async () => {
  const { url, server } = await serveWithNodeHttp(limitByClient(client));
  try {
    const response = await fetch(url, { headers: { "x-client": unique("web") } });
    assert.equal(response.status, 200);
    assert.equal(await response.text(), "hello");
    assert.match(response.headers.get("ratelimit-policy") ?? "", /q=2;w=60/);
    assert.match(response.headers.get("ratelimit") ?? "", /r=1;/);
    assert.equal(response.headers.get("retry-after"), null);
  } finally {
    await close(server);
  }
});

test("over the limit answers 429 with RateLimit headers, Retry-After and a short body", async () => {
  const { url, server } = await serveWithNodeHttp(limitByClient(client));
  const headers = { "x-client": unique("web") };
  try {
    for (let i = 0; i < 2; i++) {
      assert.equal((await fetch(url, { headers })).status, 200);
    }
    const response = await fetch(url, { headers });
    assert.equal(response.status, 429);
    assert.equal(await response.text(), "Too Many Requests\n");
    assert.match(response.headers.get("ratelimit") ?? "", /r=0;/);
    assert.match(response.headers.get("retry-after") ?? "", /^\d+$/);
  } finally {
    await close(server);
  }
});

test("requests without descriptors pass unchecked", async () => {
  const { url, server } = await serveWithNodeHttp(limitByClient(client));
  try {
    for (let i = 0; i < 4; i++) {
      const response = await fetch(url);
      assert.equal(response.status, 200);
      assert.equal(response.headers.get("ratelimit"), null);
    }
  } finally {
    await close(server);
  }
});

test("an error the failure mode cannot decide goes to next(error)", async () => {
  // An empty domain is refused by the server with INVALID_ARGUMENT.
  const { url, server } = await serveWithNodeHttp(limitByClient(client, ""));
  try {
    const response = await fetch(url, { headers: { "x-client": "anyone" } });
    assert.equal(response.status, 500);
    assert.match(await response.text(), /FloodgateError.*INVALID_ARGUMENT/);
  } finally {
    await close(server);
  }
});

test("with floodgate down, fail-open lets requests through and fail-closed answers 429", async () => {
  const stopped = await FloodgateServer.start();
  await stopped.stop();
  const open = new FloodgateClient(stopped.grpcTarget, { failureMode: "open" });
  const closed = new FloodgateClient(stopped.grpcTarget, { failureMode: "closed" });
  const openApp = await serveWithNodeHttp(limitByClient(open));
  const closedApp = await serveWithNodeHttp(limitByClient(closed));
  const headers = { "x-client": "anyone" };
  try {
    assert.equal((await fetch(openApp.url, { headers })).status, 200);
    assert.equal((await fetch(closedApp.url, { headers })).status, 429);
  } finally {
    open.close();
    closed.close();
    await close(openApp.server);
    await close(closedApp.server);
  }
});

test("works as Express middleware", async () => {
  const app = express();
  app.use(limitByClient(client));
  app.get("/", (_req, res) => {
    res.send("hello");
  });
  const server = createServer(app);
  const url = await listen(server);
  const headers = { "x-client": unique("express") };
  try {
    const statuses: number[] = [];
    for (let i = 0; i < 3; i++) {
      statuses.push((await fetch(url, { headers })).status);
    }
    assert.deepEqual(statuses, [200, 200, 429]);
  } finally {
    await close(server);
  }
});
