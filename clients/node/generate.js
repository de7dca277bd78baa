#!/usr/bin/env node
// Streams a completion to stdout:
//   node clients/node/generate.js "prompt" [--address localhost:50051] [--max-tokens N]
//        [--temperature T] [--api-key KEY] [--tls]
// The address and key default to $TURNSTILE_ADDRESS and $TURNSTILE_API_KEY. A one-line summary
// (finish reason, token counts) goes to stderr so stdout holds only the generated text.
'use strict';

const { parseArgs } = require('node:util');
const { createClient, status } = require('./index.js');

const USAGE = 'usage: generate.js "prompt" [--address HOST:PORT] [--max-tokens N] ' +
  '[--temperature T] [--api-key KEY] [--tls]';

function parseCommandLine() {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      address: { type: 'string', default: process.env.TURNSTILE_ADDRESS || 'localhost:50051' },
      'max-tokens': { type: 'string' },
      temperature: { type: 'string' },
      'api-key': { type: 'string', default: process.env.TURNSTILE_API_KEY },
      tls: { type: 'boolean', default: false },
      help: { type: 'boolean', short: 'h', default: false },
    },
  });
  if (values.help || positionals.length !== 1) {
    console.error(USAGE);
    process.exit(values.help ? 0 : 2);
  }
  return { prompt: positionals[0], ...values };
}

function number(text, flag) {
  const value = Number(text);
  if (text.trim() === '' || !Number.isFinite(value)) {
    console.error(`${flag} takes a number, got ${JSON.stringify(text)}\n${USAGE}`);
    process.exit(2);
  }
  return value;
}

async function main() {
  const args = parseCommandLine();
  const request = { text: args.prompt, sampling: {} };
  if (args['max-tokens'] !== undefined) request.max_tokens = number(args['max-tokens'], '--max-tokens');
  if (args.temperature !== undefined) request.sampling.temperature = number(args.temperature, '--temperature');

  const client = createClient(args.address, { apiKey: args['api-key'], tls: args.tls });
  try {
    for await (const response of client.generateStream(request)) {
      process.stdout.write(response.text);
      if (response.finish_reason !== 'FINISH_REASON_UNSPECIFIED') {
        const { prompt_tokens, completion_tokens } = response.usage ?? {};
        process.stdout.write('\n');
        console.error(`[${response.finish_reason}: ${prompt_tokens} prompt + ` +
          `${completion_tokens} completion tokens]`);
      }
    }
  } catch (err) {
    const codeName = Object.keys(status).find((name) => status[name] === err.code) ?? err.code;
    console.error(`\nerror: ${codeName}: ${err.details ?? err.message}`);
    process.exitCode = 1;
  } finally {
    client.close();
  }
}

main();
