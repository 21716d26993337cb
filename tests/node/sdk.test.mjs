// pdgate driven by the official OpenAI Node SDK, the client most users
// actually run. Starts its own engines (pdgate-sim: 1 prefill + 1 decode) and
// gateway on ephemeral ports, learns each port from the process's
// "listening on" line, and checks what the SDK sees: bodies, streams,
// usage, errors and the X-Request-Id header.
//
// Binaries come from $PDGATE_BUILD_DIR, or ../../build by default.
// Run: npm ci && node --test   (or via ctest once tests/node is added)
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
const buildDir = path.resolve(process.env.PDGATE_BUILD_DIR ?? path.join(here, '..', '..', 'build'));
const PDGATE = path.join(buildDir, 'pdgate');
const SIM = path.join(buildDir, 'pdgate-sim');
const MODEL = 'sim-model';
const ITL_MS = 20;
// Sanitizer builds start and run several times slower; be generous.
const STARTUP_MS = 30_000;

const children = [];

// Starts `bin args...` and resolves with its base URL once it prints
// "... listening on http://HOST:PORT". A wildcard listen address is turned
// into loopback so the URL can be used as is.
function start(name, bin, args) {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    const proc = { name, child, args, stderr: '', exited: false, closed: false };
    children.push(proc);
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (s) => {
      // Keep the tail only: enough to explain a failure.
      proc.stderr = (proc.stderr + s).slice(-64 * 1024);
    });
    const timer = setTimeout(() => {
      reject(new Error(`${name} did not print its listening line within ${STARTUP_MS} ms\n${proc.stderr}`));
    }, STARTUP_MS);
    const lines = createInterface({ input: child.stdout });
    let found = false;
    lines.on('line', (line) => {
      const m = /listening on (https?:\/\/\S+)/.exec(line);
      if (found || !m) return;
      found = true;
      clearTimeout(timer);
      const url = new URL(m[1]);
      if (url.hostname === '0.0.0.0' || url.hostname === '[::]') url.hostname = '127.0.0.1';
      resolve(url.origin);
    });
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(new Error(`${name}: cannot start ${bin}: ${err.message}`));
    });
    child.on('close', () => {
      proc.closed = true;
    });
    child.on('exit', (code, signal) => {
      proc.exited = true;
      clearTimeout(timer);
      if (!found) {
        reject(new Error(`${name} exited (code ${code}, signal ${signal}) before listening\n${proc.stderr}`));
      }
    });
  });
}

// Stops a process and waits until its stderr is fully read, so a sanitizer
// report printed at exit is seen.
async function stop(proc) {
  if (proc.closed) return;
  const gone = new Promise((resolve) => proc.child.once('close', resolve));
  proc.child.kill('SIGTERM');
  const timer = setTimeout(() => proc.child.kill('SIGKILL'), 10_000);
  await gone;
  clearTimeout(timer);
}

// If the runner itself dies, take the engines and gateways with it.
process.on('exit', () => {
  for (const p of children) if (!p.exited) p.child.kill('SIGKILL');
});

function hostPort(url) {
  return new URL(url).host;
}

function client(baseURL) {
  // No retries: a retried request would hide a gateway failure.
  return new OpenAI({ baseURL: `${baseURL}/v1`, apiKey: 'sk-pdgate-test', maxRetries: 0, timeout: 60_000 });
}

// Collects a stream's chunks with the time each arrived.
async function drain(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push({ at: performance.now(), chunk });
  return chunks;
}

function sanitizerReports() {
  return children
    .filter((p) => /ERROR: (Address|Leak)Sanitizer|runtime error:/.test(p.stderr))
    .map((p) => `${p.name}:\n${p.stderr}`);
}

describe('pdgate with the OpenAI Node SDK', () => {
  let gateway; // 1 prefill + 1 healthy decode
  let brokenGateway; // 1 prefill + 1 decode that dies mid-stream
  let openai;

  before(async () => {
    for (const bin of [PDGATE, SIM]) {
      assert.ok(existsSync(bin), `${bin} is missing: build first (bash scripts/build.sh) or set PDGATE_BUILD_DIR`);
    }
    const sim = ['--port', '0', '--model', MODEL, '--itl-ms', String(ITL_MS)];
    const [prefill, decode, brokenDecode] = await Promise.all([
      start('prefill', SIM, ['--role', 'prefill', ...sim]),
      start('decode', SIM, ['--role', 'decode', ...sim]),
      start('broken-decode', SIM, ['--role', 'decode', ...sim, '--die-after-chunks', '4']),
    ]);
    const gw = (d) => ['--port', '0', '--model', MODEL, '--prefill', hostPort(prefill), '--decode', hostPort(d)];
    [gateway, brokenGateway] = await Promise.all([
      start('pdgate', PDGATE, gw(decode)),
      start('pdgate-broken', PDGATE, gw(brokenDecode)),
    ]);
    openai = client(gateway);
  });

  after(async () => {
    await Promise.all(children.map(stop));
    const reports = sanitizerReports();
    assert.deepEqual(reports, [], 'a process printed a sanitizer report');
  });

  // Listing models through the gateway shows the engines' served model.
  test('models.list names the served model', async () => {
    const page = await openai.models.list();
    assert.ok(page.data.some((m) => m.id === MODEL), JSON.stringify(page.data));
  });

  // A plain chat completion comes back whole, with usage and a request id.
  test('chat completion, not streamed', async () => {
    const { data, response } = await openai.chat.completions
      .create({ model: MODEL, messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 8 })
      .withResponse();
    assert.equal(response.status, 200);
    assert.ok(response.headers.get('x-request-id'), 'X-Request-Id header missing');
    assert.equal(data.object, 'chat.completion');
    assert.equal(data.choices.length, 1);
    const choice = data.choices[0];
    assert.equal(choice.message.role, 'assistant');
    assert.equal(typeof choice.message.content, 'string');
    assert.ok(choice.message.content.length > 0, 'empty content');
    assert.ok(['length', 'stop'].includes(choice.finish_reason), choice.finish_reason);
    assert.ok(data.usage.prompt_tokens > 0);
    assert.ok(data.usage.completion_tokens > 0 && data.usage.completion_tokens <= 8);
  });

  // A streamed chat arrives as many deltas spread over time (not buffered),
  // ends with a finish_reason, then a usage-only chunk when asked for.
  test('chat completion, streamed with include_usage', async () => {
    const maxTokens = 12;
    const { data: stream, response } = await openai.chat.completions
      .create({
        model: MODEL,
        messages: [{ role: 'user', content: 'Count slowly.' }],
        max_tokens: maxTokens,
        stream: true,
        stream_options: { include_usage: true },
      })
      .withResponse();
    assert.equal(response.status, 200);
    assert.match(response.headers.get('content-type') ?? '', /text\/event-stream/);
    assert.ok(response.headers.get('x-request-id'), 'X-Request-Id header missing');

    const chunks = await drain(stream);
    const content = chunks.filter(({ chunk }) => chunk.choices?.[0]?.delta?.content);
    assert.ok(content.length >= 2, `expected several content deltas, got ${content.length}`);
    for (const { chunk } of chunks) assert.equal(chunk.object, 'chat.completion.chunk');

    // Unbuffered relay: deltas are spaced by the engine's inter-token
    // latency, so the first arrives well before the last.
    const spread = content.at(-1).at - content[0].at;
    assert.ok(spread >= 3 * ITL_MS, `deltas arrived within ${spread.toFixed(1)} ms: buffered?`);

    const finishes = chunks.map(({ chunk }) => chunk.choices?.[0]?.finish_reason).filter(Boolean);
    assert.equal(finishes.length, 1, `finish_reasons: ${finishes}`);
    assert.ok(['length', 'stop'].includes(finishes[0]));

    const last = chunks.at(-1).chunk;
    assert.deepEqual(last.choices, [], 'the usage chunk has no choices');
    assert.ok(last.usage, 'no usage chunk');
    assert.ok(last.usage.completion_tokens > 0 && last.usage.completion_tokens <= maxTokens);
    assert.equal(last.usage.total_tokens, last.usage.prompt_tokens + last.usage.completion_tokens);
  });

  // A plain completion returns text and usage.
  test('completion, not streamed', async () => {
    const { data, response } = await openai.completions
      .create({ model: MODEL, prompt: 'The quick brown fox', max_tokens: 6 })
      .withResponse();
    assert.ok(response.headers.get('x-request-id'), 'X-Request-Id header missing');
    assert.equal(data.object, 'text_completion');
    assert.equal(typeof data.choices[0].text, 'string');
    assert.ok(data.choices[0].text.length > 0);
    assert.ok(['length', 'stop'].includes(data.choices[0].finish_reason));
    assert.ok(data.usage.completion_tokens > 0 && data.usage.completion_tokens <= 6);
  });

  // A streamed completion without include_usage carries text deltas, one
  // finish_reason, and no usage chunk.
  test('completion, streamed without usage', async () => {
    const stream = await openai.completions.create({
      model: MODEL,
      prompt: 'Once upon a time',
      max_tokens: 6,
      stream: true,
    });
    const chunks = (await drain(stream)).map(({ chunk }) => chunk);
    assert.ok(chunks.filter((c) => c.choices?.[0]?.text).length >= 1, 'no text delta');
    const text = chunks.map((c) => c.choices?.[0]?.text ?? '').join('');
    assert.ok(text.length > 0);
    const finishes = chunks.map((c) => c.choices?.[0]?.finish_reason).filter(Boolean);
    assert.equal(finishes.length, 1, `finish_reasons: ${finishes}`);
    assert.ok(chunks.every((c) => !c.usage), 'usage chunk sent without include_usage');
  });

  // The client's own X-Request-Id is kept and returned; without one, each
  // request gets a fresh id.
  test('X-Request-Id: the client id is echoed, fresh ids are unique', async () => {
    const mine = `sdk-test-${Date.now()}-${Math.random().toString(16).slice(2)}`;
    const { response } = await openai.chat.completions
      .create(
        { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 },
        { headers: { 'X-Request-Id': mine } },
      )
      .withResponse();
    assert.equal(response.headers.get('x-request-id'), mine);

    const ids = await Promise.all(
      [0, 1].map(async () => {
        const { response: r } = await openai.completions
          .create({ model: MODEL, prompt: 'x', max_tokens: 1 })
          .withResponse();
        return r.headers.get('x-request-id');
      }),
    );
    assert.ok(ids[0] && ids[1]);
    assert.notEqual(ids[0], ids[1]);
  });

  // A model the engines do not serve: the engine's 404 reaches the SDK,
  // which throws a NotFoundError carrying the engine's message.
  test('unknown model: the SDK throws NotFoundError (404) with the engine message', async () => {
    const bad = 'no-such-model';
    await assert.rejects(
      openai.chat.completions.create({ model: bad, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }),
      (err) => {
        assert.ok(err instanceof OpenAI.APIError, `not an APIError: ${err}`);
        assert.ok(err instanceof OpenAI.NotFoundError, `not a NotFoundError: ${err}`);
        assert.equal(err.status, 404);
        assert.match(err.message, new RegExp(bad), 'the message should name the model');
        return true;
      },
    );
  });

  // The decode engine dies mid-stream: the SDK raises an error while
  // iterating instead of seeing a fake, clean end of stream.
  test('decode dies mid-stream: the SDK iteration throws, no fake finish', async () => {
    const stream = await client(brokenGateway).chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Tell a long story.' }],
      max_tokens: 40,
      stream: true,
    });
    const seen = [];
    await assert.rejects(
      (async () => {
        for await (const chunk of stream) seen.push(chunk);
      })(),
      (err) => {
        assert.ok(err instanceof OpenAI.APIError, `not an APIError: ${err}`);
        return true;
      },
    );
    assert.ok(seen.length >= 1, 'no chunk arrived before the break');
    const finishes = seen.map((c) => c.choices?.[0]?.finish_reason).filter(Boolean);
    assert.deepEqual(finishes, [], 'a finish_reason was sent for a broken stream');
  });
});

// The SDK over TLS, trusting the gateway's CA the way Node users do: with
// NODE_EXTRA_CA_CERTS, read when Node starts, so the SDK calls run in a
// child Node process started with it. Certificates are made here with the
// openssl command (a CA and a server certificate for localhost).
describe('pdgate over TLS with the OpenAI Node SDK', () => {
  let dir;
  let gateway;

  before(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'pdgate-node-tls-'));
    const f = (n) => path.join(dir, n);
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    const openssl = (args) => execFileSync('openssl', args, { stdio: 'ignore', timeout: 60_000 });
    openssl(['req', '-x509', ...ec, '-keyout', f('ca.key'), '-out', f('ca.pem'), '-days', '2',
      '-subj', '/CN=pdgate-node-test-ca']);
    openssl(['req', '-new', ...ec, '-keyout', f('server.key'), '-out', f('server.csr'),
      '-subj', '/CN=localhost']);
    writeFileSync(f('server.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
    openssl(['x509', '-req', '-in', f('server.csr'), '-CA', f('ca.pem'), '-CAkey', f('ca.key'),
      '-set_serial', '0x77', '-days', '2', '-extfile', f('server.ext'), '-out', f('server.pem')]);
    const sim = ['--port', '0', '--model', MODEL, '--itl-ms', String(ITL_MS)];
    const [prefill, decode] = await Promise.all([
      start('tls-prefill', SIM, ['--role', 'prefill', ...sim]),
      start('tls-decode', SIM, ['--role', 'decode', ...sim]),
    ]);
    const url = await start('pdgate-tls', PDGATE, ['--port', '0', '--host', '127.0.0.1', '--model',
      MODEL, '--prefill', hostPort(prefill), '--decode', hostPort(decode), '--tls-cert',
      f('server.pem'), '--tls-key', f('server.key')]);
    assert.match(url, /^https:/);
    gateway = url.replace('127.0.0.1', 'localhost');
  });

  // Its engines and gateway too: their open pipes would keep this runner
  // alive after the last test (the first suite stopped only its own).
  after(async () => {
    await Promise.all(children.map(stop));
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  // Runs `body` (an async function's text, given `openai`) in a child Node
  // with NODE_EXTRA_CA_CERTS; returns what it printed as JSON.
  function withSdk(body, extraCa = true) {
    const script = `import OpenAI from 'openai';
const openai = new OpenAI({ baseURL: process.argv[1] + '/v1', apiKey: 'sk-tls', maxRetries: 0, timeout: 60000 });
const out = await (async () => { ${body} })().catch((e) => ({ error: String(e && (e.cause?.code ?? e.message)) }));
process.stdout.write(JSON.stringify(out));`;
    const env = { ...process.env };
    if (extraCa) env.NODE_EXTRA_CA_CERTS = path.join(dir, 'ca.pem');
    else delete env.NODE_EXTRA_CA_CERTS;
    const out = execFileSync(process.execPath, ['--input-type=module', '-e', script, gateway], {
      cwd: here, env, timeout: 90_000, encoding: 'utf8',
    });
    return JSON.parse(out);
  }

  // A whole chat completion and a streamed one arrive over TLS.
  test('chat completion and stream over https', () => {
    const r = withSdk(`
      const whole = await openai.chat.completions.create({ model: '${MODEL}',
        messages: [{ role: 'user', content: 'hi' }], max_tokens: 6 });
      const stream = await openai.chat.completions.create({ model: '${MODEL}',
        messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, stream: true });
      let text = ''; let chunks = 0;
      for await (const c of stream) { chunks++; text += c.choices[0]?.delta?.content ?? ''; }
      return { tokens: whole.usage.completion_tokens, chunks, text };
    `);
    assert.equal(r.tokens, 6, JSON.stringify(r));
    assert.ok(r.chunks >= 6, JSON.stringify(r));
    assert.ok(r.text.length > 0, JSON.stringify(r));
  });

  // Without the CA the SDK refuses the gateway's certificate.
  test('an untrusted certificate is refused by the SDK', () => {
    const r = withSdk(`return await openai.models.list();`, false);
    assert.ok(r.error, JSON.stringify(r));
  });
});
