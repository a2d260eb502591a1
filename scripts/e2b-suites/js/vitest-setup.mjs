// vitest's setup file for E2B's JavaScript suites (scripts/e2b-suites.sh): loads the loopback
// guard into the worker (NODE_OPTIONS loads it too), and skips before it runs every test the
// runner found naming a public host (their names are in CORDON_E2B_DESELECT, a JSON file of
// "<file relative to the suite's tests>::<test name>"), saying so on the output.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'
import { beforeEach } from 'vitest'

createRequire(import.meta.url)('./loopback-guard.cjs')

const listed = process.env.CORDON_E2B_DESELECT
const deselected = new Set(listed ? JSON.parse(readFileSync(listed, 'utf8')) : [])
const testsDir = process.env.CORDON_E2B_TESTS_DIR ?? ''

// vitest reads a hook's first parameter for the fixtures it uses: a destructuring pattern.
beforeEach(({ task, skip }) => {
  const file = path.relative(testsDir, task.file?.filepath ?? '')
  if (deselected.has(`${file}::${task.name}`)) {
    skip('names a public host (scripts/e2b-suites.sh)')
  }
})
