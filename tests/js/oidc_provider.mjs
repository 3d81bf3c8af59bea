// A real OpenID Connect provider on loopback for the sign-in tests: node-oidc-provider (certified)
// with three people, a groups claim and a login form of its own (no consent page).
//
//   node tests/js/oidc_provider.mjs PORT REDIRECT_URI
//
// Prints "ready ISSUER" on stdout once it listens. Clients: "gpuwarden" (secret "gpuwarden-secret",
// redirect REDIRECT_URI) and "other-app" (secret "other-secret", the same redirect: it exists so a
// test can hold a real ID token made for another audience). Every password is "pw-" + the login.
import http from 'node:http';
import { generateKeyPairSync } from 'node:crypto';
import Provider from 'oidc-provider';

const [port, redirectUri] = process.argv.slice(2);
if (!port || !redirectUri) {
  console.error('usage: node oidc_provider.mjs PORT REDIRECT_URI');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;

// The people: a researcher, the lead of her team, an admin, and a fleet-wide reader.
const PEOPLE = {
  alice: { name: 'Alice Researcher', email: 'alice@example.org', groups: ['vision'] },
  bob: { name: 'Bob Lead', email: 'bob@example.org', groups: ['vision', 'vision-leads'] },
  carol: { name: 'Carol Admin', email: 'carol@example.org', groups: ['gpuwarden-admins'] },
  frank: { name: 'Frank Finance', email: 'frank@example.org', groups: ['gpuwarden-readers'] },
};

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: 'jwk' }), kid: 'test-key-1', alg: 'RS256', use: 'sig' };

const SCOPES = 'openid profile email groups';
const provider = new Provider(issuer, {
  clients: [
    {
      client_id: 'gpuwarden',
      client_secret: 'gpuwarden-secret',
      redirect_uris: [redirectUri],
      grant_types: ['authorization_code'],
      response_types: ['code'],
    },
    {
      client_id: 'other-app',
      client_secret: 'other-secret',
      redirect_uris: [redirectUri],
      grant_types: ['authorization_code'],
      response_types: ['code'],
    },
  ],
  jwks: { keys: [jwk] },
  scopes: ['openid', 'profile', 'email', 'groups'],
  claims: {
    openid: ['sub'],
    profile: ['preferred_username', 'name'],
    email: ['email'],
    groups: ['groups'],
  },
  // The scopes' claims go in the ID token itself, as Keycloak and Entra ID put them there.
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  features: { devInteractions: { enabled: false } },
  findAccount: async (ctx, id) => {
    const person = PEOPLE[id];
    if (!person) return undefined;
    return {
      accountId: id,
      claims: async () => ({ sub: id, preferred_username: id, ...person }),
    };
  },
  // First-party client: every scope granted at login, no consent page.
  loadExistingGrant: async (ctx) => {
    const grantId =
      ctx.oidc.result?.consent?.grantId || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope(SCOPES);
    await grant.save();
    return grant;
  },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  ttl: { Interaction: 600, Session: 3600, Grant: 3600, AuthorizationCode: 60, IdToken: 300 },
});
provider.on('server_error', (ctx, err) => console.error('server_error', err));

function escape(text) {
  return String(text).replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);
}

function form(uid, message) {
  return `<!doctype html><html><head><title>Test identity provider</title></head><body>
<h1>Sign in to the test identity provider</h1>${message ? `<p id="error">${escape(message)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
<label>Login <input name="login" id="login" autofocus></label>
<label>Password <input name="password" id="password" type="password"></label>
<button type="submit" id="sign-in">Sign in</button></form></body></html>`;
}

async function body(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString());
}

const handle = provider.callback();
const server = http.createServer(async (req, res) => {
  const path = new URL(req.url, issuer).pathname;
  const match = /^\/interaction\/([^/]+)(\/login)?$/.exec(path);
  if (!match) return handle(req, res);
  try {
    const details = await provider.interactionDetails(req, res);
    if (req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
      return res.end(form(details.uid));
    }
    const fields = await body(req);
    const login = fields.get('login') || '';
    if (!PEOPLE[login] || fields.get('password') !== `pw-${login}`) {
      res.writeHead(401, { 'content-type': 'text/html; charset=utf-8' });
      return res.end(form(details.uid, 'unknown login or wrong password'));
    }
    return await provider.interactionFinished(
      req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false },
    );
  } catch (err) {
    res.writeHead(400, { 'content-type': 'text/plain' });
    return res.end(String(err));
  }
});
server.listen(Number(port), '127.0.0.1', () => console.log(`ready ${issuer}`));
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => server.close(() => process.exit(0)));
