// Runs a real floodgate process for the tests: the binary built by `cargo build` (or
// FLOODGATE_BIN), on free loopback ports, serving the rules in test/rules.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import * as path from "node:path";
import { createInterface } from "node:readline";

/** clients/typescript, from build/test where the compiled tests run. */
export const PACKAGE_ROOT = path.resolve(__dirname, "..", "..");
const REPOSITORY_ROOT = path.resolve(PACKAGE_ROOT, "..", "..");
const RULES_DIR = path.join(PACKAGE_ROOT, "test", "rules");
const STARTUP_TIMEOUT_MS = 15_000;

/** The domain of test/rules/client_test.yaml. */
export const DOMAIN = "ts_client";

/** A value no other test uses, so each test counts against fresh quota. */
export function unique(label: string): string {
  return `${label}-${process.pid}-${Math.random().toString(36).slice(2)}`;
}

function floodgateBinary(): string {
  const binary =
    process.env.FLOODGATE_BIN ?? path.join(REPOSITORY_ROOT, "target", "debug", "floodgate");
  if (!existsSync(binary)) {
    throw new Error(
      `floodgate binary not found at ${binary}: run \`cargo build\` at ${REPOSITORY_ROOT} ` +
        "or set FLOODGATE_BIN",
    );
  }
  return binary;
}

export class FloodgateServer {
  private constructor(
    private readonly child: ChildProcess,
    /** host:port of the gRPC listener. */
    readonly grpcTarget: string,
  ) {}

  /** Starts floodgate and resolves once it prints the addresses it listens on. */
  static async start(extraArgs: readonly string[] = []): Promise<FloodgateServer> {
    const args = [
      "serve",
      "--rules", RULES_DIR,
      "--grpc-addr", "127.0.0.1:0",
      "--http-addr", "127.0.0.1:0",
      ...extraArgs,
    ];
    const child = spawn(floodgateBinary(), args, { stdio: ["ignore", "pipe", "pipe"] });
    let stderr = "";
    child.stderr?.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    try {
      const line = await firstLine(child);
      const grpc = /grpc=(\S+)/.exec(line)?.[1];
      if (grpc === undefined) {
        throw new Error(`unexpected first line from floodgate: ${line}`);
      }
      return new FloodgateServer(child, grpc);
    } catch (error) {
      child.kill("SIGKILL");
      throw new Error(`floodgate did not start: ${String(error)}\n${stderr}`);
    }
  }

  /** Stops the process gracefully and waits until it is gone. */
  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) {
      return;
    }
    const exited = new Promise((resolve) => this.child.once("exit", resolve));
    this.child.kill("SIGCONT"); // a frozen process must run to handle SIGTERM
    this.child.kill("SIGTERM");
    await exited;
  }

  /** Freezes the process: connections stay open, but nothing is answered. */
  freeze(): void {
    this.child.kill("SIGSTOP");
  }
}

function firstLine(child: ChildProcess): Promise<string> {
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    const timer = setTimeout(() => reject(new Error("no output in time")), STARTUP_TIMEOUT_MS);
    lines.once("line", (line) => {
      // readline goes on reading the later lines, so the process never blocks on a full pipe.
      clearTimeout(timer);
      resolve(line);
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`exited early (code ${code}, signal ${signal})`));
    });
  });
}
