/** GET /swagger/json (the OpenAPI document) and GET /swagger (Swagger UI, served from the swagger-ui-dist package: nothing loads from elsewhere). */
import { createRequire } from 'node:module'
import { dirname, join } from 'node:path'
import { Elysia, type AnyElysia } from 'elysia'
import { errors } from '../errors.ts'
import { openApiDocument } from './document.ts'

const assetsDir = dirname(createRequire(import.meta.url).resolve('swagger-ui-dist/swagger-ui-bundle.js'))
const assets = new Set(['swagger-ui-bundle.js', 'swagger-ui.css', 'favicon-32x32.png'])

// The page's own script, a file rather than inline so the page's policy allows scripts from the service only.
// No validator badge (it would send the document's address to validator.swagger.io); no ?url= to load another document.
const init = `window.ui = SwaggerUIBundle({
  url: '/swagger/json',
  dom_id: '#swagger-ui',
  deepLinking: true,
  validatorUrl: null,
  queryConfigEnabled: false,
})
`

const page = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Agent Marketplace API</title>
<link rel="icon" type="image/png" href="/swagger/assets/favicon-32x32.png">
<link rel="stylesheet" href="/swagger/assets/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/swagger/assets/swagger-ui-bundle.js"></script>
<script src="/swagger/assets/init.js"></script>
</body>
</html>
`

const hidden = { detail: { hide: true } }

/**
 * The reference, for `app` (whose routes it documents, once all are registered: the document is made
 * on first request and kept). The page may load only what the service serves, and call only the
 * service (its `SITE_URL` too, where "Try it out" sends requests).
 */
export function openApiRoutes(app: () => AnyElysia, siteUrl: string) {
  let document: ReturnType<typeof openApiDocument> | undefined
  const policy = [
    "default-src 'self'",
    "img-src 'self' data:",
    "style-src 'self' 'unsafe-inline'",
    `connect-src 'self' ${new URL(siteUrl).origin}`,
    "object-src 'none'",
    "base-uri 'none'",
    "frame-ancestors 'none'",
  ].join('; ')
  return new Elysia({ name: 'openapi' })
    .get('/swagger/json', () => (document ??= openApiDocument(app(), siteUrl)), hidden)
    .get('/swagger', () => new Response(page, { headers: { 'content-type': 'text/html; charset=utf-8', 'content-security-policy': policy } }), hidden)
    .get(
      '/swagger/assets/init.js',
      () => new Response(init, { headers: { 'content-type': 'text/javascript; charset=utf-8', 'cache-control': 'public, max-age=3600' } }),
      hidden,
    )
    .get(
      '/swagger/assets/:file',
      ({ params }) => {
        if (!assets.has(params.file)) throw errors.notFound('File')
        return new Response(Bun.file(join(assetsDir, params.file)), { headers: { 'cache-control': 'public, max-age=3600' } })
      },
      hidden,
    )
}
