// Build step: copy the repository's proto/ into the package (so a packed tarball carries the
// contract it loads at run time) and generate TypeScript types for the decoded messages.
// Starts from a clean slate so nothing stale from an earlier build survives.
import { cpSync, existsSync, rmSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const packageRoot = join(dirname(fileURLToPath(import.meta.url)), "..");
const repositoryProto = join(packageRoot, "..", "..", "proto");
const packageProto = join(packageRoot, "proto");
const generated = join(packageRoot, "src", "generated");

if (!existsSync(repositoryProto)) {
  console.error(`gen-proto: ${repositoryProto} not found; build from the floodgate repository`);
  process.exit(1);
}

for (const stale of [packageProto, generated, join(packageRoot, "dist")]) {
  rmSync(stale, { recursive: true, force: true });
}
cpSync(repositoryProto, packageProto, { recursive: true });

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
    "envoy/service/ratelimit/v3/rls.proto",
    `--includeDirs=${packageProto}`,
  ],
  { stdio: "inherit" },
);
