// The Node client of tests/test_node_shm_columns.py: a column region (shm) against the unix
// reference, every result (shm: the zero-copy views) and final equal in every auto-reset mode,
// SEND / RECV for N > 1; prints one JSON line.
//   node tests/node_shm_columns_client.js NODE_DIST SHM_URL UNIX_URL N
"use strict";
const dist = process.argv[2];
const { connect } = require(dist + "/index.js");
const { SCHEMA } = require(dist + "/generated/image_columns.js");
const [shmUrl, unixUrl, n] = [process.argv[3], process.argv[4], Number(process.argv[5])];
const codec = SCHEMA.structs.StepResult;
const names = SCHEMA.ir.structs.StepResult.fields.map((f) => f.name);
const hex = (r) => Buffer.from(codec.encode(Object.fromEntries(names.map((k) => [k, r[k]])))).toString("hex");
const list = (r) => (Array.isArray(r) ? r : [r]);
const legal = (r, turn) => {
  const moves = [];
  r.action_mask.forEach((m, a) => { if (m && a !== 1) moves.push(a); });
  return moves[(turn * 7) % moves.length];
};
const check = (ok, what) => { if (!ok) throw new Error(what); };
(async () => {
  const out = { finals: 0, steps: 0, zeroCopy: true };
  for (const mode of ["disabled", "next_step", "same_step"]) {
    const shm = await connect(shmUrl, { schema: SCHEMA, autoreset: mode });
    const unix = await connect(unixUrl, { schema: SCHEMA, autoreset: mode });
    let a = list(await shm.reset(5n));
    let b = list(await unix.reset(5n, { copy: true }));
    check(a.map(hex).join() === b.map(hex).join(), `${mode} reset`);
    for (let t = 0; t < 12; t++) {
      const actions = b.map((r, i) => legal(r, t + i));
      a = list(await shm.step(n === 1 ? actions[0] : actions));
      b = list(await unix.step(n === 1 ? actions[0] : actions, { copy: true }));
      check(a.map(hex).join() === b.map(hex).join(), `${mode} step ${t}`);
      const fa = shm.finals.map((f) => f.index + ":" + hex(f.result)).join();
      const fb = unix.finals.map((f) => f.index + ":" + hex(f.result)).join();
      check(fa === fb, `${mode} finals of step ${t}`);
      out.finals += shm.finals.length;
      out.steps++;
      if (mode === "disabled" && b.some((r) => r.terminated || r.truncated)) {
        a = list(await shm.reset(BigInt(t)));
        b = list(await unix.reset(BigInt(t), { copy: true }));
        check(a.map(hex).join() === b.map(hex).join(), `reset after step ${t}`);
        out.resets = (out.resets || 0) + 1;
      }
    }
    const mapping = shm.channel.region.bytes.buffer;
    const columns = shm.columns();
    out.zeroCopy = out.zeroCopy && columns.observation.buffer === mapping && a[0].observation.buffer === mapping &&
      columns.observation.length === n * 3 * 84 * 84 && a[n - 1].observation.byteOffset === columns.observation.byteOffset + (n - 1) * 21168;
    if (n > 1 && mode === "disabled") {
      await shm.send([legal(b[2], 0), legal(b[0], 0)], [2, 0]);
      await unix.send([legal(b[2], 0), legal(b[0], 0)], [2, 0]);
      const ra = await shm.recv(2);
      const rb = await unix.recv(2);
      const byId = (r) => r.envIds.map((e, k) => e + ":" + hex(r.results[k])).sort().join();
      check(byId(ra) === byId(rb), "RECV");
      out.recv = true;
    }
    await shm.close();
    await unix.close();
  }
  process.stdout.write(JSON.stringify(out) + "\n");
})().catch((e) => { process.stdout.write(JSON.stringify({ error: String(e && e.stack || e) }) + "\n"); process.exit(1); });
