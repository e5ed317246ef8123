// Reads a session's event stream the way a browser page does, with the npm
// `eventsource` package (the WHATWG EventSource): `onmessage` for the events, a
// listener for the named `end`. The first connection is cut after `cut` bytes, in
// the middle of a frame, so the client reconnects by itself with `Last-Event-ID`.
// Prints {events: [{id, type}], reconnects: [lastEventId sent], ended}.
import { EventSource } from 'eventsource';

const [url, token, cut] = process.argv.slice(2);
const sent = [];
let connections = 0;

async function cutting(input, init) {
  connections += 1;
  const headers = new Headers(init.headers);
  sent.push(headers.get('last-event-id'));
  // A lowercase scheme, as some clients send it.
  if (token) headers.set('authorization', `bearer ${token}`);
  const response = await fetch(input, { ...init, headers });
  if (connections > 1 || !response.body) return response;
  const reader = response.body.getReader();
  let left = Number(cut);
  const body = new ReadableStream({
    async pull(controller) {
      const { done, value } = await reader.read();
      if (done) return controller.close();
      if (value.length < left) {
        left -= value.length;
        return controller.enqueue(value);
      }
      controller.enqueue(value.subarray(0, left));
      await reader.cancel();
      controller.error(new Error('connection cut by the test'));
    },
  });
  return new Response(body, { status: response.status, headers: response.headers });
}

const events = [];
const source = new EventSource(url, { fetch: cutting });
const timer = setTimeout(() => finish(false), 60_000);
source.onmessage = (event) => {
  events.push({ id: event.lastEventId, type: JSON.parse(event.data).type });
};
source.addEventListener('end', () => finish(true));

function finish(ended) {
  clearTimeout(timer);
  source.close();
  console.log(JSON.stringify({ events, reconnects: sent.slice(1), ended }));
}
