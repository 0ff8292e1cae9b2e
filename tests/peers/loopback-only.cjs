// Preload (node --require) that confines every TCP listener of a peer MCP server to 127.0.0.1.
// server-everything calls app.listen(PORT) with no host, which binds every interface; tests must
// not expose it to the network. Unix sockets (path listens) are left alone. After a listener is
// up, its real port is printed to stderr as "RELAY_LISTENING <port>" so PORT=0 can be used.
"use strict";
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const first = args[0];
  const callback = args.find((a) => typeof a === "function");
  let options;
  if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
    options = { port: Number(first), host: "127.0.0.1" };
  } else if (first && typeof first === "object" && !Array.isArray(first) && first.path === undefined) {
    options = { ...first, host: "127.0.0.1" };
  }
  if (options === undefined) {
    return listen.apply(this, args);
  }
  this.once("listening", () => {
    const address = this.address();
    process.stderr.write(`RELAY_LISTENING ${address.address} ${address.port}\n`);
  });
  return callback ? listen.call(this, options, callback) : listen.call(this, options);
};
