// vitest's setup file for E2B's JavaScript suites (scripts/e2b-suites.sh): loads the loopback
// guard into the worker (NODE_OPTIONS loads it too), and skips before it runs every test the
// runner found naming a public host (their names are in CORDON_E2B_DESELECT, a JSON file of
// "<file relative to the suite's tests>::<test name>"), saying so on the output.
//
// The SDK's own unit tests that mock E2B's API with msw (the files in CORDON_E2B_MOCKED) build
// their mocks' URLs from E2B_DOMAIN, as E2B's CI runs them: for those files E2B_API_URL and
// E2B_SANDBOX_URL are unset, so the SDK's requests reach the mock (and anything unmocked goes to
// `*.localhost`, loopback) instead of the listener; every other file gets them back.
import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'
import { beforeAll, beforeEach } from 'vitest'

createRequire(import.meta.url)('./loopback-guard.cjs')

const listed = process.env.CORDON_E2B_DESELECT
const deselected = new Set(listed ? JSON.parse(readFileSync(listed, 'utf8')) : [])
const testsDir = process.env.CORDON_E2B_TESTS_DIR ?? ''
const mockedList = process.env.CORDON_E2B_MOCKED
const mocked = new Set(mockedList ? JSON.parse(readFileSync(mockedList, 'utf8')) : [])

function pointAtListener(yes) {
  for (const name of ['E2B_API_URL', 'E2B_SANDBOX_URL']) {
    const value = process.env[`CORDON_${name}`]
    if (yes && value !== undefined) process.env[name] = value
    else delete process.env[name]
  }
}

const fileOf = (task) => path.relative(testsDir, task.file?.filepath ?? task.filepath ?? '')

// vitest reads a hook's first parameter for the fixtures it uses: a destructuring pattern.
// eslint-disable-next-line no-empty-pattern
beforeAll(({}, suite) => pointAtListener(!mocked.has(fileOf(suite))))

beforeEach(({ task, skip }) => {
  const file = fileOf(task)
  if (deselected.has(`${file}::${task.name}`)) {
    skip('names a public host (scripts/e2b-suites.sh)')
  }
})
