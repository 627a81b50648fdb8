// The viewer's JSON API (arttrace/viewer/_app.py). An answer that is not 2xx becomes an
// ApiError carrying the server's message and fix.

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error) || `HTTP ${status}`);
    this.status = status;
    this.fix = (body && body.fix) || "";
    this.state = body && body.state;
  }
}

export async function get(path, params = {}) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined && value !== "") query.set(key, value);
  }
  const url = `api/${path}${query.toString() ? `?${query}` : ""}`;
  let response;
  try {
    response = await fetch(url, { headers: { accept: "application/json" } });
  } catch (error) {
    throw new ApiError(0, {
      error: "the viewer does not answer (it was stopped, or the network is down)",
      fix: "start `arttrace view` again, then reload this page",
    });
  }
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    body = { error: `HTTP ${response.status}: not JSON` };
  }
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}
