// Drives a divvy server through the official npm client, @button/divvy-client.
// Usage: node hit-sequence.js HOST PORT
// Reads a JSON array of operations on stdin, sends them one after another,
// then all of them again at once (pipelined on the client's one connection),
// and prints one JSON result per hit, in order, on stdout.
'use strict';

const DivvyClient = require('@button/divvy-client');

async function main() {
  const [host, port] = [process.argv[2], Number(process.argv[3])];
  const input = await new Promise((resolve) => {
    let data = '';
    process.stdin.on('data', (chunk) => { data += chunk; });
    process.stdin.on('end', () => resolve(data));
  });
  const ops = JSON.parse(input);
  const client = new DivvyClient(host, port, { defaultCommandTimeoutMillis: 10000 });
  for (const op of ops.sequential) {
    const result = await client.hit(op);
    console.log(JSON.stringify(result));
  }
  const pipelined = await Promise.all(ops.pipelined.map((op) => client.hit(op)));
  for (const result of pipelined) {
    console.log(JSON.stringify(result));
  }
  client.close();
}

main().catch((err) => {
  console.error(`divvy client failed: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
});
