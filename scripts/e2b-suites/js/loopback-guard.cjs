// Keeps E2B's JavaScript test suites on this machine (scripts/e2b-suites.sh), as
// cordon_e2b_guard.py does for the Python ones: loaded into every Node process of a run
// (`NODE_OPTIONS=--require`, and vitest's setup file for its workers), it refuses resolving any
// name but `localhost` and `*.localhost`, and connecting (TCP, TLS, HTTP/1 and 2, undici,
// fetch, UDP) to any address but loopback, so a test that tries fails loudly instead of
// sending. Every client in Node ends in net.Socket#connect or dgram, which are patched here.
'use strict'

const net = require('node:net')
const dns = require('node:dns')
const dgram = require('node:dgram')

const GUARDED = Symbol.for('cordon.e2b-suites.loopback-guard')

function loopbackName(host) {
  const h = String(host).toLowerCase().replace(/\.$/, '')
  return h === 'localhost' || h.endsWith('.localhost')
}

const LOOPBACK = new net.BlockList()
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4')
LOOPBACK.addAddress('::1', 'ipv6')
LOOPBACK.addSubnet('::ffff:127.0.0.0', 104, 'ipv6')

function loopbackHost(host) {
  if (host === undefined || host === null || host === '') return true // Node's default: localhost
  const h = String(host).replace(/^\[|\]$/g, '').split('%')[0]
  const family = net.isIP(h)
  if (family !== 0) return LOOPBACK.check(h, family === 4 ? 'ipv4' : 'ipv6')
  return loopbackName(h)
}

function refuse(what, host) {
  const err = new Error(`e2b-suites: ${what} ${JSON.stringify(String(host))} refused: ` +
    'only loopback is reachable from the suites')
  err.code = 'ECONNREFUSED'
  return err
}

// The options of net.Socket#connect in any of its call forms (options, [port, host], [path]).
function connectTarget(args) {
  let a = args
  if (Array.isArray(a[0])) a = a[0] // net.connect's normalized [options, cb] form
  const first = a[0]
  if (first !== null && typeof first === 'object') {
    // Node takes a truthy `path` as a Unix socket (http's agent passes `path: null`).
    return first.path ? null : { host: first.host }
  }
  if (typeof first === 'string' && Number.isNaN(Number(first))) return null // a Unix socket
  return { host: typeof a[1] === 'string' ? a[1] : undefined }
}

// `*.localhost` is loopback by definition (RFC 6761): answered here, so no DNS query leaves
// for it (the system resolver would ask its server); any other name but `localhost` is refused.
function guardedLookup(lookup) {
  return function (hostname, options, callback) {
    const cb = typeof options === 'function' ? options : callback
    const opts = typeof options === 'object' && options !== null ? options : {}
    if (!loopbackHost(hostname)) {
      process.nextTick(cb, refuse('resolving', hostname))
      return
    }
    if (net.isIP(String(hostname)) === 0 && loopbackName(hostname) &&
        String(hostname).toLowerCase() !== 'localhost') {
      const entry = { address: '127.0.0.1', family: 4 }
      if (opts.all) process.nextTick(cb, null, [entry])
      else process.nextTick(cb, null, entry.address, entry.family)
      return
    }
    return lookup.apply(this, arguments)
  }
}

function install() {
  if (globalThis[GUARDED]) return
  globalThis[GUARDED] = true

  const realConnect = net.Socket.prototype.connect
  net.Socket.prototype.connect = function (...args) {
    const target = connectTarget(args)
    if (target && !loopbackHost(target.host)) {
      const err = refuse('connecting to', target.host)
      process.nextTick(() => this.destroy(err))
      return this
    }
    return realConnect.apply(this, args)
  }

  dns.lookup = guardedLookup(dns.lookup)
  const realPromiseLookup = dns.promises.lookup
  dns.promises.lookup = async function (hostname, ...rest) {
    if (!loopbackHost(hostname)) throw refuse('resolving', hostname)
    if (net.isIP(String(hostname)) === 0 && String(hostname).toLowerCase() !== 'localhost') {
      const entry = { address: '127.0.0.1', family: 4 }
      return rest[0] && rest[0].all ? [entry] : entry
    }
    return realPromiseLookup.call(this, hostname, ...rest)
  }
  // Queries of public DNS (resolve*, reverse) would send a packet: none is answered here.
  for (const [obj, isPromise] of [[dns, false], [dns.promises, true],
    [dns.Resolver.prototype, false], [dns.promises.Resolver.prototype, true]]) {
    for (const name of Object.keys(obj)) {
      if (!/^(resolve|reverse)/.test(name) || typeof obj[name] !== 'function') continue
      obj[name] = function (hostname, ...rest) {
        const err = refuse('querying DNS for', hostname)
        if (isPromise) return Promise.reject(err)
        const cb = rest[rest.length - 1]
        if (typeof cb === 'function') process.nextTick(cb, err)
        else throw err
      }
    }
  }

  for (const method of ['send', 'connect']) {
    const real = dgram.Socket.prototype[method]
    dgram.Socket.prototype[method] = function (...args) {
      // send(msg, [offset, length,] port, address, cb); connect(port, address, cb)
      const address = args.find((a, i) => i > 0 && typeof a === 'string')
      if (address !== undefined && !loopbackHost(address)) throw refuse('sending to', address)
      return real.apply(this, args)
    }
  }
}

install()
module.exports = { loopbackHost, install }
