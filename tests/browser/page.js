// The page the browser test loads from an origin of its own: it registers, logs in
// and validates a token through authd's JSON form (fetch, Connect's unary JSON) and
// through gRPC-Web (Connect's gRPC-Web transport, with the service read from authd's
// descriptor set: no generated code), then posts what it saw to its own origin's
// /result. Query: authd (authd's base URL), user (a username prefix).
import { createClient } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { createFileRegistry, fromBinary } from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";

const params = new URLSearchParams(location.search);
const authd = params.get("authd");
const user = params.get("user");
const password = "a fine password for a browser";

async function json(method, body) {
  const answer = await fetch(`${authd}/auth.v1.AuthService/${method}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return { status: answer.status, body: await answer.json() };
}

async function overJson() {
  const username = `${user}-json`;
  const register = await json("Register", { username, password });
  const login = await json("Login", { username, password });
  const validate = await json("ValidateToken", { accessToken: login.body.accessToken });
  const wrong = await json("Login", { username, password: "not the password" });
  return {
    register: register.status,
    userId: register.body.userId,
    login: login.status,
    validate: validate.status,
    validatedUserId: validate.body.userId,
    validatedUsername: validate.body.username,
    wrongStatus: wrong.status,
    wrongCode: wrong.body.code,
  };
}

async function overGrpcWeb() {
  const descriptors = await fetch("/descriptors.bin");
  const bytes = new Uint8Array(await descriptors.arrayBuffer());
  const registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, bytes));
  const service = registry.getService("auth.v1.AuthService");
  const client = createClient(service, createGrpcWebTransport({ baseUrl: authd }));
  const username = `${user}-grpc-web`;
  const register = await client.register({ username, password });
  const login = await client.login({ username, password });
  const validate = await client.validateToken({ accessToken: login.accessToken });
  let wrongCode = null;
  try {
    await client.login({ username, password: "not the password" });
  } catch (e) {
    wrongCode = e.code;
  }
  return {
    userId: register.userId,
    validatedUserId: validate.userId,
    validatedUsername: validate.username,
    wrongCode,
  };
}

async function attempt(what) {
  try {
    return await what();
  } catch (e) {
    return { error: String(e) };
  }
}

const result = { json: await attempt(overJson), grpcWeb: await attempt(overGrpcWeb) };
await fetch("/result", { method: "POST", body: JSON.stringify(result) });
