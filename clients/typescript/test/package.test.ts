// The packed tarball, installed into a fresh project, answers a real request through
// `require` and through `import`, each type-checked against the types its condition names:
// the protos, types and both entries it needs travel inside it.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { after, before, test } from "node:test";
import { FloodgateServer, PACKAGE_ROOT, unique } from "./floodgate";

let server: FloodgateServer;
let workDir: string;
let app: string;
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
  packedFiles = packed.files.map((file) => file.path);
  app = path.join(workDir, "app");
  mkdirSync(app);
  writeFileSync(path.join(app, "package.json"), JSON.stringify({ name: "app", private: true }));
  // --engine-strict=false: the package asks for Node 22 or newer, and the machine running
  // these tests may have an older one (the tests say whether the code still runs there).
  npm(
    [
      "install", "--prefer-offline", "--no-audit", "--no-fund", "--engine-strict=false",
      path.join(workDir, packed.filename),
    ],
    app,
  );
});

after(async () => {
  await server?.stop();
  if (workDir) rmSync(workDir, { recursive: true, force: true });
});

test("the tarball carries both entries and their types, the protos and the licence", () => {
  for (const file of [
    "dist/index.js",
    "dist/index.d.ts",
    "dist/index.mjs",
    "dist/index.d.mts",
    "proto/envoy/service/ratelimit/v3/rls.proto",
    "proto/envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "README.md",
    "LICENSE",
  ]) {
    assert.ok(packedFiles.includes(file), `${file} is packed`);
  }
  assert.deepEqual(packedFiles.filter((file) => /^(src|test|scripts)\//.test(file)), []);
});

test("the tarball carries only the protos the service needs", () => {
  assert.deepEqual(packedFiles.filter((file) => file.startsWith("proto/")).sort(), [
    "proto/envoy/config/core/v3/base.proto",
    "proto/envoy/extensions/common/ratelimit/v3/ratelimit.proto",
    "proto/envoy/service/ratelimit/v3/rls.proto",
    "proto/envoy/type/v3/ratelimit_unit.proto",
  ]);
});

/**
 * A TypeScript program that uses the installed package, in strict mode. As main.cts it
 * compiles to a `require`, as main.mts to an `import`.
 */
const CONSUMER = `import { FloodgateClient, FloodgateError, type Decision } from "floodgate-client";

const client = new FloodgateClient(process.argv[2] ?? "", { timeoutMs: 2000 });
const user = { user_id: process.argv[3] ?? "" };
client.shouldRateLimit("ts_client", [user], 3).then((decision: Decision) => {
  console.log(JSON.stringify({ ...decision, errorClass: typeof FloodgateError }));
  client.close();
});
`;

/** Compiles `file` in the installed app, against the tarball's .d.ts and .d.mts files. */
function typeCheckAndCompile(file: string): void {
  writeFileSync(path.join(app, file), CONSUMER);
  execFileSync(
    process.execPath,
    [
      path.join(PACKAGE_ROOT, "node_modules", "typescript", "bin", "tsc"),
      "--strict",
      "--module", "nodenext",
      "--target", "es2022",
      // Node's types come from this package's own devDependencies.
      "--typeRoots", path.join(PACKAGE_ROOT, "node_modules", "@types"),
      "--types", "node",
      file,
    ],
    { cwd: app, stdio: "inherit" },
  );
}

/** Runs a compiled consumer, spending a whole minute's quota of a user of its own. */
function runAgainstFloodgate(compiled: string): void {
  const user = unique(compiled);
  const output = execFileSync(process.execPath, [compiled, server.grpcTarget, user], {
    cwd: app,
    encoding: "utf8",
  });
  const decision = JSON.parse(output);
  assert.equal(decision.allowed, true);
  assert.equal(decision.degraded, false);
  assert.equal(decision.statuses[0].remaining, 0);
  assert.equal(decision.errorClass, "function");
}

test("required from the tarball, it type-checks and answers from a real floodgate", () => {
  typeCheckAndCompile("main.cts");
  assert.match(readFileSync(path.join(app, "main.cjs"), "utf8"), /require\("floodgate-client"\)/);
  runAgainstFloodgate("main.cjs");
});

test("imported from the tarball, it type-checks and answers from a real floodgate", () => {
  typeCheckAndCompile("main.mts");
  assert.match(readFileSync(path.join(app, "main.mjs"), "utf8"), /from "floodgate-client"/);
  runAgainstFloodgate("main.mjs");
});

test("import and require load one copy of the package, so instanceof holds across them", () => {
  const probe = `import { createRequire } from "node:module";
import * as imported from "floodgate-client";
const required = createRequire(import.meta.url)("floodgate-client");
const error = new required.FloodgateError(3, "probe");
const requiredNames = Object.keys(required).filter((name) => name !== "__esModule");
console.log(JSON.stringify({
  sameExports: Object.keys(imported).sort().join() === requiredNames.sort().join(),
  sameClass: imported.FloodgateError === required.FloodgateError,
  instanceOf: error instanceof imported.FloodgateError,
}));
`;
  writeFileSync(path.join(app, "probe.mjs"), probe);
  const output = execFileSync(process.execPath, ["probe.mjs"], { cwd: app, encoding: "utf8" });
  assert.deepEqual(JSON.parse(output), { sameExports: true, sameClass: true, instanceOf: true });
});
