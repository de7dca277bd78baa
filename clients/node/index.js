// Node.js client for turnstile.v1.GenerationService.
//
// The .proto is loaded at run time (no generated code). Messages use the proto's own field
// names (keepCase: request_id, token_ids, finish_reason), enums are their names
// ('FINISH_REASON_LENGTH'), and a set oneof or proto3 `optional` field is named by a virtual
// property (oneofs: true). Failed calls reject or throw the grpc-js error, whose `code` is the
// gRPC status (grpc.status.INVALID_ARGUMENT === 3, ...) and whose `details` is the server's message.
//
//   const { createClient } = require('turnstile-client');
//   const client = createClient('localhost:50051', { apiKey: process.env.TURNSTILE_API_KEY });
//   for await (const response of client.generateStream({ text: 'Hello', max_tokens: 16 })) {
//     process.stdout.write(response.text);
//   }
//   client.close();
'use strict';

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.join(__dirname, '..', '..', 'protos');
const PROTO_FILE = 'turnstile/v1/generate.proto';

const packageDefinition = protoLoader.loadSync(PROTO_FILE, {
  includeDirs: [PROTO_ROOT],
  keepCase: true,
  enums: String,
  longs: String, // uint64 seed: a decimal string, never a rounded Number
  defaults: true,
  oneofs: true,
});
const { GenerationService } = grpc.loadPackageDefinition(packageDefinition).turnstile.v1;

const UNFINISHED = 'FINISH_REASON_UNSPECIFIED';

// Channel credentials: `tls` false/absent is plaintext, true uses the system's root
// certificates, an object passes { rootCerts, privateKey, certChain } Buffers (mutual TLS).
function channelCredentials(tls) {
  if (!tls) return grpc.credentials.createInsecure();
  if (tls === true) return grpc.credentials.createSsl();
  return grpc.credentials.createSsl(tls.rootCerts, tls.privateKey, tls.certChain);
}

// createClient(address, { apiKey, tls, channelOptions }) connects lazily (on the first call).
// Every method takes grpc-js CallOptions last, for example { deadline: Date.now() + 5000 }.
function createClient(address, { apiKey, tls, channelOptions } = {}) {
  const stub = new GenerationService(address, channelCredentials(tls), channelOptions);

  function metadata() {
    const md = new grpc.Metadata();
    if (apiKey) md.set('authorization', `Bearer ${apiKey}`);
    return md;
  }

  function unary(method, request, callOptions = {}) {
    return new Promise((resolve, reject) => {
      stub[method](request, metadata(), callOptions, (err, response) =>
        err ? reject(err) : resolve(response));
    });
  }

  // Yields one GenerateResponse per engine step; the last one carries finish_reason, usage
  // and timings. Leaving the loop early (break, throw) cancels the call, which aborts the
  // request in the engine.
  async function* generateStream(request, callOptions = {}) {
    const call = stub.Generate(request, metadata(), callOptions);
    try {
      yield* call;
    } finally {
      call.cancel(); // no-op when the call has already ended
    }
  }

  // Collects the stream into one result.
  async function generate(request, callOptions = {}) {
    const result = {
      requestId: '', text: '', tokenIds: [], logprobs: [],
      finishReason: UNFINISHED, usage: null, timings: null,
    };
    for await (const response of generateStream(request, callOptions)) {
      result.requestId = response.request_id;
      result.text += response.text;
      result.tokenIds.push(...response.token_ids);
      result.logprobs.push(...response.logprobs);
      if (response.finish_reason !== UNFINISHED) {
        result.finishReason = response.finish_reason;
        result.usage = response.usage;
        result.timings = response.timings;
      }
    }
    return result;
  }

  return {
    generateStream,
    generate,
    tokenize: (request, callOptions) => unary('Tokenize', request, callOptions),
    getModelInfo: (callOptions) => unary('GetModelInfo', {}, callOptions),
    close: () => stub.close(),
  };
}

module.exports = { createClient, status: grpc.status };
