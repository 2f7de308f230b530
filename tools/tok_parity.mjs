// tok_parity.mjs — expected cl100k ids from the npm package gpt-tokenizer (docs/TRAINING.md §7.4) for tests/test_tok_parity.c.
// Usage: node tools/tok_parity.mjs NPM_PREFIX DOCS.bin DOCS.idx OUT.bin
//   DOCS.idx: one "start end allow" line per document (byte offsets into DOCS.bin; allow 1 = special tokens allowed).
//   OUT.bin: per document, uint32 LE count then that many uint32 LE ids.
import { readFileSync, writeFileSync } from 'node:fs'
import { join, resolve } from 'node:path'
import { pathToFileURL } from 'node:url'

const [prefix, docsPath, idxPath, outPath] = process.argv.slice(2)
if (!outPath) {
  console.error('usage: node tok_parity.mjs NPM_PREFIX DOCS.bin DOCS.idx OUT.bin')
  process.exit(2)
}
const pkg = join(resolve(prefix), 'node_modules', 'gpt-tokenizer')
const version = JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8')).version
if (version !== '4.0.0') {
  console.error(`tok_parity: gpt-tokenizer ${version} found, 4.0.0 expected`)
  process.exit(1)
}
const { encode } = await import(pathToFileURL(join(pkg, 'esm', 'encoding', 'cl100k_base.js')).href)

// gpt-tokenizer 4.0.0's own allowedSpecial path finds a special token only at the start of the text (its sticky
// special-token regex is exec'd on the whole text and the match index is then offset a second time), so documents with
// allowed specials are cut at the cl100k special spellings here, tiktoken's way: each ordinary run is encoded on its own
// and each special becomes its id (encode(special) with allowedSpecial 'all', where the special is at index 0).
const SPECIALS = /<\|(?:endoftext|fim_prefix|fim_middle|fim_suffix|im_start|im_end|im_sep|endofprompt)\|>/g
function encodeAllowingSpecials(text) {
  const ids = []
  let last = 0
  for (const m of text.matchAll(SPECIALS)) {
    ids.push(...encode(text.slice(last, m.index), { disallowedSpecial: new Set() }))
    const sp = encode(m[0], { allowedSpecial: 'all' })
    if (sp.length !== 1) throw new Error(`special ${m[0]} encoded as ${sp}`)
    ids.push(sp[0])
    last = m.index + m[0].length
  }
  ids.push(...encode(text.slice(last), { disallowedSpecial: new Set() }))
  return ids
}

const docs = readFileSync(docsPath)
const lines = readFileSync(idxPath, 'utf8').split('\n').filter((l) => l.length > 0)
const chunks = []
let total = 0
const t0 = Date.now()
for (const line of lines) {
  const [start, end, allow] = line.split(' ').map(Number)
  // fatal: a document that is not valid UTF-8 would be silently altered by a lenient decode
  const text = new TextDecoder('utf-8', { fatal: true }).decode(docs.subarray(start, end))
  const ids = allow ? encodeAllowingSpecials(text) : encode(text, { disallowedSpecial: new Set() })
  const buf = new Uint32Array(ids.length + 1)
  buf[0] = ids.length
  buf.set(ids, 1)
  chunks.push(Buffer.from(buf.buffer))
  total += ids.length
}
writeFileSync(outPath, Buffer.concat(chunks))
console.error(`tok_parity: ${lines.length} documents, ${docs.length} bytes, ${total} ids in ${Date.now() - t0} ms`)
