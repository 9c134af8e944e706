// The packed tarball, installed into a fresh project, answers a real request: the protos and
// types it needs travel inside it.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { after, before, test } from "node:test";
import { FloodgateServer, PACKAGE_ROOT } from "./floodgate";

let server: FloodgateServer;
let workDir: string;
let tarball: string;
let packedFiles: string[];

function npm(args: readonly string[], cwd: string): string {
  return execFileSync("npm", [...args], { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
}

before(async () => {
  server = await FloodgateServer.start();
  workDir = mkdtempSync(path.join(tmpdir(), "floodgate-client-"));
  // `npm test` has just built dist/ and proto/, so packing needs no build script.
  const [packed] = JSON.parse(
    npm(["pack", "--ignore-scripts", "--json", "--pack-destination", workDir], PACKAGE_ROOT),
  ) as { filename: string; files: { path: string }[] }[];
  assert.ok(packed);
  tarball = path.join(workDir, packed.filename);
  packedFiles = packed.files.map((file) => file.path);
});

after(async () => {
  await server?.stop();
  if (workDir) rmSync(workDir, { recursive: true, force: true });
});

test("the tarball carries the compiled code, its types and the protos, and no sources", () => {
  for (const file of [
    "dist/index.js",
    "dist/index.d.ts",
    "proto/envoy/service/ratelimit/v3/rls.proto",
    "proto/envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "README.md",
  ]) {
    assert.ok(packedFiles.includes(file), `${file} is packed`);
  }
  assert.deepEqual(packedFiles.filter((file) => /^(src|test|scripts)\//.test(file)), []);
});

/** A TypeScript program that uses the installed package, in strict mode. */
const CONSUMER = `import { FloodgateClient, type Decision } from "floodgate-client";

const client = new FloodgateClient(process.argv[2] ?? "", { timeoutMs: 2000 });
client.shouldRateLimit("ts_client", [{ user_id: "packed" }], 3).then((decision: Decision) => {
  console.log(JSON.stringify(decision));
  client.close();
});
`;

test("installed from the tarball, it type-checks and answers from a real floodgate", () => {
  const app = path.join(workDir, "app");
  mkdirSync(app);
  writeFileSync(path.join(app, "package.json"), JSON.stringify({ name: "app", private: true }));
  npm(["install", "--prefer-offline", "--no-audit", "--no-fund", tarball], app);
  writeFileSync(path.join(app, "main.ts"), CONSUMER);
  // Compiled against the tarball's .d.ts files (Node's types come from this package's).
  execFileSync(
    process.execPath,
    [
      path.join(PACKAGE_ROOT, "node_modules", "typescript", "bin", "tsc"),
      "--strict",
      "--module", "nodenext",
      "--target", "es2022",
      "--typeRoots", path.join(PACKAGE_ROOT, "node_modules", "@types"),
      "--types", "node",
      "main.ts",
    ],
    { cwd: app, stdio: "inherit" },
  );
  const output = execFileSync(process.execPath, ["main.js", server.grpcTarget], {
    cwd: app,
    encoding: "utf8",
  });
  const decision = JSON.parse(output);
  assert.equal(decision.allowed, true);
  assert.equal(decision.degraded, false);
  assert.equal(decision.statuses[0].remaining, 0);
});
