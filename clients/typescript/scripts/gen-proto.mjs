// Build step: copy the RLS service's proto file and the repository proto/ files it imports
// into the package (so a packed tarball carries the contract it loads at run time), and
// generate TypeScript types for the decoded messages. Imports that are not in proto/ are
// protobuf's well-known types, which proto-loader brings itself. Starts from a clean slate
// so nothing stale from an earlier build survives.
import { copyFileSync, existsSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const packageRoot = join(dirname(fileURLToPath(import.meta.url)), "..");
const repositoryProto = join(packageRoot, "..", "..", "proto");
const packageProto = join(packageRoot, "proto");
const generated = join(packageRoot, "src", "generated");
const SERVICE_PROTO = "envoy/service/ratelimit/v3/rls.proto";
// `import "a/b.proto";`, also `import public` and `import weak`, one per line.
const PROTO_IMPORT = /^\s*import\s+(?:public\s+|weak\s+)?"([^"]+)"\s*;/gm;

if (!existsSync(join(repositoryProto, SERVICE_PROTO))) {
  console.error(`gen-proto: ${repositoryProto} not found; build from the floodgate repository`);
  process.exit(1);
}

/** The service's proto file and every file it imports, directly or not, found in proto/. */
function serviceProtos() {
  const found = new Set();
  const pending = [SERVICE_PROTO];
  while (pending.length > 0) {
    const name = pending.pop();
    const file = join(repositoryProto, name);
    if (found.has(name) || !existsSync(file)) continue;
    found.add(name);
    for (const [, imported] of readFileSync(file, "utf8").matchAll(PROTO_IMPORT)) {
      pending.push(imported);
    }
  }
  return [...found].sort();
}

for (const stale of [packageProto, generated, join(packageRoot, "dist")]) {
  rmSync(stale, { recursive: true, force: true });
}
for (const name of serviceProtos()) {
  mkdirSync(dirname(join(packageProto, name)), { recursive: true });
  copyFileSync(join(repositoryProto, name), join(packageProto, name));
}

// These flags must match LOADER_OPTIONS in src/proto.ts: they describe the same decoding.
const genTypes = join(packageRoot, "node_modules", ".bin", "proto-loader-gen-types");
execFileSync(
  genTypes,
  [
    "--longs=Number",
    "--enums=String",
    "--defaults",
    "--oneofs",
    "--grpcLib=@grpc/grpc-js",
    `--outDir=${generated}`,
    SERVICE_PROTO,
    `--includeDirs=${packageProto}`,
  ],
  { stdio: "inherit" },
);
