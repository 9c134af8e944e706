// Runs a real floodgate process for the tests: the binary built by `cargo build` (or
// FLOODGATE_BIN), on free loopback ports, serving the rules in test/rules; and a real
// redis-server for it to count in, which a test freezes or leaves out.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { get } from "node:http";
import { createConnection, createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
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

/** The test's environment without FLOODGATE_* variables, which the server reads as settings. */
function serverEnvironment(settings: Readonly<Record<string, string>>): NodeJS.ProcessEnv {
  const environment: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!name.startsWith("FLOODGATE_")) {
      environment[name] = value;
    }
  }
  return { ...environment, ...settings };
}

export class FloodgateServer {
  private constructor(
    private readonly child: ChildProcess,
    /** host:port of the gRPC listener. */
    readonly grpcTarget: string,
    /** host:port of the HTTP listener (metrics); it speaks HTTP/2 but serves no gRPC. */
    readonly httpTarget: string,
  ) {}

  /**
   * Starts floodgate and resolves once it prints the addresses it listens on. `settings` are
   * FLOODGATE_* environment variables, such as `{ FLOODGATE_REDIS_COMMAND_TIMEOUT_MS: "200" }`.
   */
  static async start(
    extraArgs: readonly string[] = [],
    settings: Readonly<Record<string, string>> = {},
  ): Promise<FloodgateServer> {
    const args = [
      "serve",
      "--rules", RULES_DIR,
      "--grpc-addr", "127.0.0.1:0",
      "--http-addr", "127.0.0.1:0",
      ...extraArgs,
    ];
    const child = spawn(floodgateBinary(), args, {
      stdio: ["ignore", "pipe", "pipe"],
      env: serverEnvironment(settings),
    });
    let stderr = "";
    child.stderr?.on("data", (chunk: Buffer) => {
      stderr += chunk.toString();
    });
    try {
      const line = await firstLine(child);
      const grpc = /grpc=(\S+)/.exec(line)?.[1];
      const http = /http=(\S+)/.exec(line)?.[1];
      if (grpc === undefined || http === undefined) {
        throw new Error(`unexpected first line from floodgate: ${line}`);
      }
      return new FloodgateServer(child, grpc, http);
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
  async freeze(): Promise<void> {
    await stopProcess(this.child);
  }

  /** Kills the process at once (SIGKILL): the connections it held are reset. */
  async kill(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) {
      return;
    }
    const exited = new Promise((resolve) => this.child.once("exit", resolve));
    this.child.kill("SIGKILL");
    await exited;
  }

  /**
   * How many ShouldRateLimit attempts the server answered with `code` ("OK", "UNAVAILABLE",
   * ...), from its /metrics: what reached it, every retry included.
   */
  async requestsAnswered(code: string): Promise<number> {
    const page = await new Promise<string>((resolve, reject) => {
      get(`http://${this.httpTarget}/metrics`, (response) => {
        let body = "";
        response.setEncoding("utf8");
        response.on("data", (chunk: string) => (body += chunk));
        response.on("end", () => resolve(body));
      }).on("error", reject);
    });
    const series =
      `floodgate_requests_total{protocol="grpc",method="ShouldRateLimit",code="${code}"} `;
    const line = page.split("\n").find((candidate) => candidate.startsWith(series));
    return line === undefined ? 0 : Number(line.slice(series.length));
  }
}

/** A running redis-server (Debian's package) on a free loopback port, without persistence. */
export class RedisServer {
  private constructor(
    private readonly child: ChildProcess,
    readonly port: number,
  ) {}

  static async start(): Promise<RedisServer> {
    const port = await freePort();
    const args = ["--port", String(port), "--bind", "127.0.0.1", "--save", ""];
    args.push("--appendonly", "no", "--logfile", "", "--dir", tmpdir());
    const child = spawn("redis-server", args, { stdio: "ignore" });
    const spawned = new Promise<void>((resolve, reject) => {
      child.once("spawn", resolve);
      child.once("error", (error) =>
        reject(new Error(`cannot run redis-server (apt-get install redis-server): ${error}`)),
      );
    });
    await spawned;
    const server = new RedisServer(child, port);
    const deadline = Date.now() + STARTUP_TIMEOUT_MS;
    while (!(await pongs(port))) {
      if (Date.now() > deadline || child.exitCode !== null) {
        await server.stop();
        throw new Error(`redis-server did not answer PING on port ${port}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    return server;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /**
   * Freezes the server (SIGSTOP): connections stay open and commands go unanswered, so
   * floodgate's calls time out after its script may have run.
   */
  async freeze(): Promise<void> {
    await stopProcess(this.child);
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) {
      return;
    }
    const exited = new Promise((resolve) => this.child.once("exit", resolve));
    this.child.kill("SIGKILL");
    await exited;
  }
}

/** A loopback port nothing listens on now. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });
}

function pongs(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const connection = createConnection({ host: "127.0.0.1", port });
    let reply = "";
    const done = (answer: boolean) => {
      connection.destroy();
      resolve(answer);
    };
    connection.setTimeout(500, () => done(false));
    connection.once("error", () => done(false));
    connection.once("connect", () => connection.write("PING\r\n"));
    connection.on("data", (chunk: Buffer) => {
      reply += chunk.toString();
      if (reply.includes("\r\n")) {
        done(reply === "+PONG\r\n");
      }
    });
  });
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

/**
 * Sends SIGSTOP and waits until the kernel reports the process stopped: the signal is
 * delivered asynchronously, and a request sent in between could still be answered.
 */
async function stopProcess(child: ChildProcess): Promise<void> {
  child.kill("SIGSTOP");
  const deadline = Date.now() + 5_000;
  while (processState(child.pid) !== "T") {
    if (Date.now() > deadline) {
      throw new Error(`process ${child.pid} did not stop`);
    }
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

/** The state letter of /proc/<pid>/stat (after the command's closing parenthesis). */
function processState(pid: number | undefined): string | undefined {
  if (pid === undefined) {
    return undefined;
  }
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
}
