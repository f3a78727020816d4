// The fleet's block hash written again, in JavaScript, from vLLM's description: SHA-256 of the
// canonical CBOR encoding (RFC 8949) of (parent hash, block's token ids, extra keys), chained
// from the hash of the seed string. Reads JSON cases on stdin, writes their hashes as hex.
import { createHash } from "node:crypto";

function head(major, n) {
  const m = major << 5;
  if (n < 24) return Buffer.from([m | n]);
  if (n < 0x100) return Buffer.from([m | 24, n]);
  if (n < 0x10000) { const b = Buffer.alloc(3); b[0] = m | 25; b.writeUInt16BE(n, 1); return b; }
  if (n < 0x100000000) { const b = Buffer.alloc(5); b[0] = m | 26; b.writeUInt32BE(n, 1); return b; }
  const b = Buffer.alloc(9); b[0] = m | 27; b.writeBigUInt64BE(BigInt(n), 1); return b;
}

function encode(value) {
  if (value === null) return Buffer.from([0xf6]);
  if (typeof value === "number") return value >= 0 ? head(0, value) : head(1, -1 - value);
  if (typeof value === "string") {
    const bytes = Buffer.from(value, "utf8");
    return Buffer.concat([head(3, bytes.length), bytes]);
  }
  if (Buffer.isBuffer(value)) return Buffer.concat([head(2, value.length), value]);
  if (Array.isArray(value)) return Buffer.concat([head(4, value.length), ...value.map(encode)]);
  throw new Error(`cannot encode ${typeof value}`);
}

const sha256 = (value) => createHash("sha256").update(encode(value)).digest();

function blockHashes({ tokens, block_size, seed, lora_name, cache_salt }) {
  let parent = sha256(seed);
  const hashes = [];
  for (let start = 0; start + block_size <= tokens.length; start += block_size) {
    const keys = [];
    if (lora_name) keys.push(lora_name);
    if (cache_salt && start === 0) keys.push(cache_salt);
    parent = sha256([parent, tokens.slice(start, start + block_size), keys.length ? keys : null]);
    hashes.push(parent.toString("hex"));
  }
  return hashes;
}

let input = "";
process.stdin.on("data", (chunk) => { input += chunk; });
process.stdin.on("end", () => {
  process.stdout.write(JSON.stringify(JSON.parse(input).map(blockHashes)));
});
