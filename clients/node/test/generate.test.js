// Runs against a live server: TURNSTILE_ADDRESS=host:port npm test --prefix clients/node
// (the Python service tests start a real server and run this with that variable set).
'use strict';

const assert = require('node:assert/strict');
const { test, before, after } = require('node:test');
const { createClient, status } = require('../index.js');

const UNFINISHED = 'FINISH_REASON_UNSPECIFIED';
const MAX_TOKENS = 8;
const REQUEST = { text: 'The capital of France is', sampling: { temperature: 0 }, max_tokens: MAX_TOKENS };

let client;

before(() => {
  const address = process.env.TURNSTILE_ADDRESS;
  assert.ok(address, 'set TURNSTILE_ADDRESS=host:port of a running Turnstile server');
  client = createClient(address, { apiKey: process.env.TURNSTILE_API_KEY });
});

after(() => client?.close());

test('Generate streams deltas and ends with one finished message', async () => {
  const responses = [];
  for await (const response of client.generateStream(REQUEST)) responses.push(response);

  assert.ok(responses.length >= 1, 'at least one message');
  const requestId = responses[0].request_id;
  assert.ok(requestId, 'the server assigns a request_id');
  for (const response of responses) assert.equal(response.request_id, requestId);

  const last = responses.at(-1);
  for (const response of responses.slice(0, -1)) assert.equal(response.finish_reason, UNFINISHED);
  assert.notEqual(last.finish_reason, UNFINISHED, 'the last message carries finish_reason');

  const numTokens = responses.reduce((n, response) => n + response.token_ids.length, 0);
  assert.ok(last.usage, 'the last message carries usage');
  assert.equal(numTokens, last.usage.completion_tokens);
  assert.ok(numTokens <= MAX_TOKENS, `${numTokens} tokens > max_tokens ${MAX_TOKENS}`);
  assert.ok(last.usage.prompt_tokens > 0);
});

test('generate() collects the stream', async () => {
  const result = await client.generate(REQUEST);
  assert.notEqual(result.finishReason, UNFINISHED);
  assert.equal(result.tokenIds.length, result.usage.completion_tokens);
  assert.equal(typeof result.text, 'string');
});

test('Tokenize counts the prompt as Generate does', async () => {
  const { token_ids } = await client.tokenize({ text: REQUEST.text });
  const { usage } = await client.generate(REQUEST);
  assert.ok(token_ids.length > 0);
  assert.equal(token_ids.length, usage.prompt_tokens);
});

test('GetModelInfo describes the model', async () => {
  const info = await client.getModelInfo();
  assert.ok(info.vocab_size > 0);
  assert.ok(info.max_model_len > 0);
});

test('an out-of-range field fails with INVALID_ARGUMENT', async () => {
  // top_p is `optional float`: an explicit 0 is sent (and is outside (0, 1]).
  const request = { ...REQUEST, sampling: { top_p: 0 } };
  await assert.rejects(client.generate(request), (err) => {
    assert.equal(err.code, status.INVALID_ARGUMENT, `got ${err.code}: ${err.details}`);
    return true;
  });
});
