// Jobs per second through pg-boss on the local server, doing per job what every path of
// benches/postgres_queue.rs does: enqueue it, claim it, run a no-op (n -> 2n), store its result,
// settle the claim, and hand the result to the client that submitted it.
//
// - *pg-boss, insert*: one producer `insert`s all N jobs, 1,000 per call (ids chosen by the
//   producer, since `insert` returns none); then C clients read their jobs' results back.
// - *pg-boss, send*: C concurrent clients `send` one job per call; then each reads its jobs'
//   results back.
//
// W workers (`work` called W times, so W handlers run at once) take jobs `batchSize` at a time.
// A handler given one job returns its result, which pg-boss stores as the job's output when it
// completes it; given several, it completes each with its own output (pg-boss 10 stores a
// handler's return value only for a batch of one, and its own `complete` of the batch afterwards
// finds the jobs completed already). A client reads a result with `getJobById`,
// polling every PEER_POLL_MS until the job is completed: pg-boss 10 has no completion event a
// sender can wait on.
//
// A pg-boss 10 worker waits out its polling interval (at least 0.5 s) after every fetch, even one
// that returned jobs. Each handler here calls `notifyWorker` on its own worker, the documented way
// to skip that wait, so a worker fetches again at once while jobs are waiting and polls every
// 0.5 s only when the queue is empty, as the other systems' workers do.
//
// Environment (as benches/postgres_queue.rs): PG_JOBS (10000), PG_WORKERS (2), PG_CLIENTS (64),
// PG_ROUNDS (1), PG_PATHS (0,1: insert, send); DATABASE_URL (the local server's bench_peers);
// PGBOSS_BATCH, jobs per fetch (10, apalis' default, so both peers claim alike; pg-boss' own
// default is 1); PEER_POLL_MS (100); PEER_POOL, connections (16, as our pool).
//
// pg-boss is pinned at 10.x: 11 and later need Node 22, and the machines here have Node 20.

import { randomUUID } from 'node:crypto'
import PgBoss from 'pg-boss'

const env = (name, fallback) => {
  const value = Number.parseInt(process.env[name] ?? '', 10)
  return Number.isNaN(value) ? fallback : value
}

const scale = {
  jobs: env('PG_JOBS', 10000),
  workers: env('PG_WORKERS', 2),
  clients: env('PG_CLIENTS', 64),
  rounds: env('PG_ROUNDS', 1),
  batch: env('PGBOSS_BATCH', 10),
  pollMs: env('PEER_POLL_MS', 100),
  pool: env('PEER_POOL', 16)
}
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/bench_peers'
const names = ['pg-boss, insert', 'pg-boss, send']
const chosen = (process.env.PG_PATHS ?? '0,1').split(',').map(n => Number.parseInt(n, 10))

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms))
const doubled = job => job.data.n * 2

/** Starts the W workers on `queue`; returns their ids, for `offWork`. */
async function startWorkers (boss, queue) {
  const ids = []
  for (let w = 0; w < scale.workers; w++) {
    const self = {}
    self.id = await boss.work(queue, { batchSize: scale.batch, pollingIntervalSeconds: 0.5 }, async jobs => {
      boss.notifyWorker(self.id)
      if (jobs.length === 1) {
        return doubled(jobs[0])
      }
      await Promise.all(jobs.map(job => boss.complete(queue, job.id, doubled(job))))
    })
    ids.push(self.id)
  }
  return ids
}

/** Reads job `id`'s result, polling until pg-boss has completed it. */
async function resultOf (boss, queue, id) {
  for (;;) {
    const job = await boss.getJobById(queue, id)
    if (job?.state === 'completed') {
      return job.output.value
    }
    if (job?.state === 'failed') {
      throw new Error(`job ${id} failed: ${JSON.stringify(job.output)}`)
    }
    await sleep(scale.pollMs)
  }
}

/** Client `c` of C owns the jobs with n % C == c, as in our bench. */
function jobsOf (client) {
  const mine = []
  for (let n = 1; n <= scale.jobs; n++) {
    if (n % scale.clients === client) {
      mine.push(n)
    }
  }
  return mine
}

async function takeResults (boss, queue, idOf) {
  await Promise.all(Array.from({ length: scale.clients }, async (_, client) => {
    for (const n of jobsOf(client)) {
      const value = await resultOf(boss, queue, idOf.get(n))
      if (value !== n * 2) {
        throw new Error(`job ${n}: result ${value}, expected ${n * 2}`)
      }
    }
  }))
}

async function insertRound (boss, queue) {
  const idOf = new Map()
  for (let first = 1; first <= scale.jobs; first += 1000) {
    const chunk = []
    for (let n = first; n < first + 1000 && n <= scale.jobs; n++) {
      const id = randomUUID()
      idOf.set(n, id)
      chunk.push({ id, name: queue, data: { n } })
    }
    await boss.insert(chunk)
  }
  await takeResults(boss, queue, idOf)
}

async function sendRound (boss, queue) {
  const idOf = new Map()
  await Promise.all(Array.from({ length: scale.clients }, async (_, client) => {
    for (const n of jobsOf(client)) {
      idOf.set(n, await boss.send(queue, { n }))
    }
  }))
  await takeResults(boss, queue, idOf)
}

/**
 * One timed round of `path` on a fresh queue (a table of its own: pg-boss 10 gives each queue a
 * partition); jobs/s. The queue is left in place: `deleteQueue` refuses a queue that still has
 * jobs, and run.sh drops the schema before each run.
 */
async function round (boss, path, number) {
  const queue = `bench_${path}_${number}_${process.pid}`
  await boss.createQueue(queue)
  const workers = await startWorkers(boss, queue)
  const started = performance.now()
  await (path === 0 ? insertRound : sendRound)(boss, queue)
  const seconds = (performance.now() - started) / 1000
  for (const id of workers) {
    await boss.offWork({ id })
  }
  return scale.jobs / seconds
}

const median = values => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]

async function main () {
  const boss = new PgBoss({ connectionString: databaseUrl, schema: 'pgboss', max: scale.pool })
  boss.on('error', error => console.error('pg-boss:', error.message))
  await boss.start()
  const rates = names.map(() => [])
  for (let number = 0; number < scale.rounds; number++) {
    for (const path of names.keys()) {
      if (chosen.includes(path)) {
        rates[path].push(await round(boss, path, number))
      }
    }
  }
  await boss.stop({ graceful: true, wait: true })
  console.log(`pgboss: ${scale.jobs} jobs per run, ${scale.workers} workers, ${scale.clients} clients, ` +
    `batch ${scale.batch}, ${scale.rounds} rounds`)
  for (const [path, name] of names.entries()) {
    if (rates[path].length === 0) {
      continue
    }
    const best = Math.max(...rates[path])
    console.log(`  ${name.padEnd(29)} median ${median(rates[path]).toFixed(0).padStart(9)} jobs/s  ` +
      `best ${best.toFixed(0).padStart(9)} jobs/s`)
  }
}

await main()
