// The bearer token (server.auth_token), read once from the page's URL (?token=...) and kept for this tab only
// (sessionStorage). It is removed from the address bar at once, so it stays out of history, bookmarks, Referer
// headers and proxy logs. Requests send it as `Authorization: Bearer`; only a WebSocket, which cannot carry
// headers, puts it in its URL.
const KEY = 'assistant.token';
const url = new URL(location.href);
const fromUrl = url.searchParams.get('token');
if (fromUrl !== null) {
  sessionStorage.setItem(KEY, fromUrl);
  url.searchParams.delete('token');
  history.replaceState(history.state, '', url.pathname + url.search + url.hash);
}

export const token = sessionStorage.getItem(KEY) || '';

export function authHeaders(extra = {}) {
  return token ? { ...extra, Authorization: `Bearer ${token}` } : extra;
}
