// Build step after tsc: writes the package's ES module entry (dist/index.mjs) and its types
// (dist/index.d.mts) over the CommonJS build. The entry re-exports the CommonJS module's own
// exports rather than a second compilation of the sources, so `import` and `require` share
// one copy of the code: one parsed set of protos, and one FloodgateError class, so that
// `instanceof` holds however each part of a program loaded the package.
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const dist = join(dirname(fileURLToPath(import.meta.url)), "..", "dist");
const IDENTIFIER = /^[A-Za-z_$][\w$]*$/;

// Loading the module runs no request: the protos are parsed on a client's first use.
const commonjs = createRequire(import.meta.url)(join(dist, "index.js"));
const names = Object.keys(commonjs)
  .filter((name) => name !== "__esModule" && name !== "default")
  .sort();
const invalid = names.filter((name) => !IDENTIFIER.test(name));
if (names.length === 0 || invalid.length > 0) {
  console.error(`esm-entry: unexpected exports of dist/index.js: ${JSON.stringify(names)}`);
  process.exit(1);
}

writeFileSync(
  join(dist, "index.mjs"),
  `// floodgate-client's ES module entry: the CommonJS build's exports (one copy of the code).
import floodgate from "./index.js";

export const { ${names.join(", ")} } = floodgate;
`,
);
writeFileSync(
  join(dist, "index.d.mts"),
  `// The types of floodgate-client's ES module entry: those of the CommonJS build.
export * from "./index.js";
`,
);
