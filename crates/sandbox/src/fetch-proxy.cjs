'use strict';
// Steadfast: route Node's built-in fetch through the sandbox's egress proxy, as
// HTTP(S)_PROXY asks. Node reads those variables itself only from Node 24
// (NODE_USE_ENV_PROXY=1, also set); before, its fetch would try to connect directly,
// which the sandbox's network refuses, so nothing it does could be held for approval.
(function () {
  const proxy = process.env.HTTPS_PROXY || process.env.HTTP_PROXY;
  if (!proxy || typeof globalThis.fetch !== 'function') return;
  const [major, minor] = process.versions.node.split('.').map(Number);
  if (major >= 24 || (major === 22 && minor >= 21)) return; // NODE_USE_ENV_PROXY does it
  const key = Symbol.for('undici.globalDispatcher.1');
  try {
    // Loads the built-in undici, which installs its default dispatcher.
    globalThis.fetch('data:,').catch(() => {});
  } catch (_) {
    return;
  }
  const current = globalThis[key];
  if (!current || typeof current.constructor !== 'function') return;
  const net = require('node:net');
  const tls = require('node:tls');
  const via = new URL(proxy);
  function connect(opts, callback) {
    const https = opts.protocol === 'https:';
    const port = opts.port || (https ? 443 : 80);
    const host = opts.hostname.includes(':') ? `[${opts.hostname}]` : opts.hostname;
    const socket = net.connect(Number(via.port || 80), via.hostname);
    let done = false;
    const fail = (err) => {
      if (done) return;
      done = true;
      socket.destroy();
      callback(err, null);
    };
    socket.once('error', fail);
    socket.once('connect', () => {
      socket.write(`CONNECT ${host}:${port} HTTP/1.1\r\nHost: ${host}:${port}\r\n\r\n`);
    });
    let head = Buffer.alloc(0);
    const onData = (chunk) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      socket.removeListener('data', onData);
      const status = head.subarray(0, end).toString('latin1').split('\r\n')[0];
      if (!/^HTTP\/1\.[01] 2\d\d/.test(status)) {
        fail(new Error(`the egress proxy refused ${host}:${port}: ${status}`));
        return;
      }
      const rest = head.subarray(end + 4);
      if (rest.length) socket.unshift(rest);
      done = true;
      socket.removeListener('error', fail);
      if (!https) {
        callback(null, socket);
        return;
      }
      const secure = tls.connect({
        socket,
        servername: opts.servername || (net.isIP(opts.hostname) ? undefined : opts.hostname),
        ALPNProtocols: ['http/1.1'],
      });
      secure.once('secureConnect', () => callback(null, secure));
      secure.once('error', (err) => callback(err, null));
    };
    socket.on('data', onData);
  }
  try {
    globalThis[key] = new current.constructor({ connect });
  } catch (_) {
    // Another dispatcher than undici's own Agent: left as it is.
  }
})();
