// A small kibo client over @connectrpc/connect-node: creates a workspace, checks that a
// start of an AVAILABLE workspace is a CONFLICT (decoding kibo.ctrl.v1.ErrorDetail from the
// Connect error details), then stops (settled), starts (settled) and deletes it (settled)
// and watches it until DELETED.
//
//   node dist/client.js --base-url http://127.0.0.1:8080 --transport connect --http 1.1
//   node dist/client.js --base-url http://127.0.0.1:8080 --transport connect --http 2 --binary
//   node dist/client.js --base-url http://127.0.0.1:8080 --transport grpc-web
//
// The token (--token, default $KIBO_TOKEN) is sent as `Authorization: Bearer TOKEN`: a
// server started without --insecure-no-auth needs it (its DATA_DIR/admin.token).
//
// Settling: a command RPC may answer while the command is still PENDING or RUNNING. The
// client then resends the identical request (same command ID) until the state is terminal;
// a resend never executes the command again.

import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";

import type { DescEnum } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";

import { CommandState, CommandStateSchema, type WorkspaceCommand } from "../gen/kibo/ctrl/v1/command_pb.js";
import { ErrorDetailSchema, ErrorReason, ErrorReasonSchema } from "../gen/kibo/ctrl/v1/error_pb.js";
import { StopDurabilitySchema, type Workspace, WorkspaceState, WorkspaceStateSchema } from "../gen/kibo/ctrl/v1/workspace_pb.js";
import { StopMode, WorkspaceService } from "../gen/kibo/ctrl/v1/workspace_service_pb.js";

type Workspaces = Client<typeof WorkspaceService>;

const { values: args } = parseArgs({
  options: {
    "base-url": { type: "string", default: "http://127.0.0.1:8080" },
    transport: { type: "string", default: "connect" }, // connect | grpc-web | grpc
    http: { type: "string", default: "1.1" }, // 1.1 | 2
    binary: { type: "boolean", default: false }, // Connect only: protobuf instead of JSON
    timeout: { type: "string", default: "60" }, // seconds for the whole run
    token: { type: "string", default: process.env.KIBO_TOKEN ?? "" }, // bearer token
  },
});

// Sends the kibo token (--token, default $KIBO_TOKEN) as `Authorization: Bearer TOKEN`.
const withToken: Interceptor = (next) => async (request) => {
  if (args.token) {
    request.header.set("Authorization", `Bearer ${args.token}`);
  }
  return await next(request);
};

function transport(): Transport {
  const interceptors = [withToken];
  const baseUrl = args["base-url"]!;
  const httpVersion = args.http === "2" ? "2" : "1.1";
  switch (args.transport) {
    case "connect":
      return createConnectTransport({ baseUrl, httpVersion, useBinaryFormat: args.binary, interceptors });
    case "grpc-web":
      return createGrpcWebTransport({ baseUrl, httpVersion, interceptors });
    case "grpc":
      return createGrpcTransport({ baseUrl, interceptors });
    default:
      throw new Error(`unknown --transport ${args.transport}: use connect, grpc-web or grpc`);
  }
}

function name(schema: DescEnum, value: number): string {
  return schema.value[value]?.name ?? String(value);
}

function log(message: string): void {
  console.log(message);
}

const TERMINAL = new Set([CommandState.SUCCEEDED, CommandState.FAILED]);

/**
 * Resend `call` (the identical request, same command ID) while the command is PENDING or
 * RUNNING; fail if it ends FAILED or the answer is about another command.
 */
async function settle<R extends { command?: WorkspaceCommand }>(
  what: string,
  commandId: string,
  call: () => Promise<R>,
): Promise<R> {
  for (let attempt = 1; ; attempt++) {
    const response = await call();
    const command = response.command;
    if (command?.commandId !== commandId) {
      throw new Error(`${what}: the answer is about command ${command?.commandId}, sent ${commandId}`);
    }
    const state = name(CommandStateSchema, command.state);
    if (!TERMINAL.has(command.state)) {
      log(`${what}: call ${attempt}: ${state}, resending`);
      await new Promise((resolve) => setTimeout(resolve, Math.min(20 * attempt, 200)));
      continue;
    }
    log(`${what}: command ${commandId} ${state} after ${attempt} call(s)`);
    if (command.state !== CommandState.SUCCEEDED) {
      throw new Error(`${what} failed: ${command.error?.message ?? "no error message"}`);
    }
    return response;
  }
}

/** Follow WatchWorkspace until the workspace is in `wanted` (or the stream ends). */
async function watchUntil(client: Workspaces, workspaceId: string, wanted: WorkspaceState): Promise<Workspace> {
  const abort = new AbortController();
  let last: Workspace | undefined;
  try {
    for await (const message of client.watchWorkspace({ workspaceId }, { signal: abort.signal })) {
      last = message.workspace;
      if (last?.state === wanted) {
        break;
      }
    }
  } finally {
    abort.abort();
  }
  if (last?.state !== wanted) {
    const seen = last === undefined ? "nothing" : name(WorkspaceStateSchema, last.state);
    throw new Error(`watch of ${workspaceId} ended at ${seen}, wanted ${name(WorkspaceStateSchema, wanted)}`);
  }
  log(`watch: ${workspaceId} is ${name(WorkspaceStateSchema, wanted)}`);
  return last;
}

function commandId(): string {
  return `example/${randomUUID()}`;
}

async function main(): Promise<void> {
  const client = createClient(WorkspaceService, transport());
  log(`transport: ${args.transport} http/${args.http}${args.binary ? " binary" : ""} ${args["base-url"]}`);

  const capabilities = await client.getCapabilities({});
  log(`capabilities: ${capabilities.capabilities.join(", ")}`);

  // Create (settled) and wait until AVAILABLE.
  const createRequest = {
    metadata: { commandId: commandId() },
    spec: { resources: { vcpus: 1, memoryMib: 512, writableLayerGib: 1 }, labels: { example: "node" } },
  };
  const created = await settle("create", createRequest.metadata.commandId, () => client.createWorkspace(createRequest));
  const workspaceId = created.workspace!.workspaceId;
  log(`created ${workspaceId}`);
  let workspace = await watchUntil(client, workspaceId, WorkspaceState.AVAILABLE);

  // Starting an AVAILABLE workspace is a CONFLICT: FAILED_PRECONDITION with an ErrorDetail.
  try {
    await client.startWorkspace({ metadata: { commandId: commandId() }, workspaceId });
    throw new Error("starting an AVAILABLE workspace was accepted");
  } catch (error) {
    const connectError = ConnectError.from(error);
    const [detail] = connectError.findDetails(ErrorDetailSchema);
    if (connectError.code !== Code.FailedPrecondition || detail?.reason !== ErrorReason.CONFLICT) {
      throw error;
    }
    log(
      `conflict: code=${Code[connectError.code]} reason=${name(ErrorReasonSchema, detail.reason)} ` +
        `workspace_state=${detail.workspaceState} hint=${JSON.stringify(detail.hint)}`,
    );
  }

  // Stop (graceful), settled: the same request, same command ID, until terminal.
  const stopRequest = {
    metadata: { commandId: commandId() },
    workspaceId,
    expectedExpirationRevision: workspace.expiration?.revision ?? 0n,
    mode: StopMode.GRACEFUL,
  };
  const stopped = await settle("stop", stopRequest.metadata.commandId, () => client.stopWorkspace(stopRequest));
  workspace = await watchUntil(client, workspaceId, WorkspaceState.STOPPED);
  log(`stop durability: ${name(StopDurabilitySchema, stopped.command?.result?.durability ?? 0)}`);

  // Start, settled, and wait until AVAILABLE.
  const startRequest = {
    metadata: { commandId: commandId() },
    workspaceId,
    expectedExpirationRevision: workspace.expiration?.revision ?? 0n,
  };
  await settle("start", startRequest.metadata.commandId, () => client.startWorkspace(startRequest));
  workspace = await watchUntil(client, workspaceId, WorkspaceState.AVAILABLE);

  // Delete, settled, and watch until DELETED (the server ends the stream after it).
  const deleteRequest = {
    metadata: { commandId: commandId() },
    workspaceId,
    expectedExpirationRevision: workspace.expiration?.revision ?? 0n,
  };
  const deleted = await settle("delete", deleteRequest.metadata.commandId, () => client.deleteWorkspace(deleteRequest));
  await watchUntil(client, workspaceId, WorkspaceState.DELETED);

  const command = await client.getWorkspaceCommand({ commandId: deleted.command!.commandId });
  log(`delete command: ${name(CommandStateSchema, command.command?.state ?? 0)}`);
  log(`ok ${workspaceId}`);
}

const seconds = Number(args.timeout);
setTimeout(() => {
  console.error(`timed out after ${seconds} s`);
  process.exit(2);
}, seconds * 1000).unref();

main().then(
  () => process.exit(0),
  (error: unknown) => {
    console.error(error instanceof ConnectError ? `${Code[error.code]}: ${error.rawMessage}` : error);
    process.exit(1);
  },
);

