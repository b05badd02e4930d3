/** GET /device: where a device's verification link lands; says how to approve the code it shows. */
import { Elysia, t } from 'elysia'
import type { RouteDeps } from './routes.ts'
import { Query } from '../http/schema.ts'

const codeShape = /^[BCDFGHJKLMNPQRSTVWXZ]{4}-?[BCDFGHJKLMNPQRSTVWXZ]{4}$/i

export function devicePage({ config }: Pick<RouteDeps, 'config'>) {
  return new Elysia({ tags: ['auth'] }).get(
    '/device',
    ({ query }) => {
      const code = query.user_code && codeShape.test(query.user_code) ? query.user_code.toUpperCase() : null
      const shown = code ?? 'XXXX-XXXX'
      const html = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Approve a device</title>
<style>body{font:16px/1.6 system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;color:#222}
code,pre{background:#f4f4f4;padding:.1rem .3rem;border-radius:4px}pre{padding:1rem;overflow:auto}.code{font-size:2rem;letter-spacing:.2rem}</style>
</head><body>
<h1>Approve a device</h1>
${code ? `<p>The device shows this code:</p><p class="code"><code>${code}</code></p>` : '<p>Enter the code your device shows.</p>'}
<p>Approve it while signed in, with your account's token:</p>
<pre>curl -X PATCH ${config.siteUrl}/v1/auth/device-codes/${shown} \\
  -H "Authorization: Bearer $TOKEN"</pre>
<p>To refuse it, send <code>{"action": "deny"}</code> as a JSON body (add <code>-H "Content-Type: application/json" -d '{"action": "deny"}'</code>). Codes last 15 minutes.</p>
</body></html>`
      return new Response(html, { headers: { 'content-type': 'text/html; charset=utf-8' } })
    },
    {
      // No length limit: a value of another form is not shown, and the page is the answer either way.
      query: Query({ user_code: t.Optional(t.String()) }),
      detail: {
        operationId: 'devicePage',
        summary: 'The device verification page: how to approve the code',
        description:
          'No credential; an HTML page for a browser, where `verificationUriComplete` leads. ' +
          'It shows the `user_code` it is given (when it has the form of one) and the PATCH /v1/auth/device-codes/{code} ' +
          'request that approves it, or denies it with `{"action": "deny"}`. The code is not looked up here.',
        security: [],
        responses: { 200: { description: 'HTML page', content: { 'text/html': { schema: { type: 'string' } } } } },
      },
    },
  )
}
