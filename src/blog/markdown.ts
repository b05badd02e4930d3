/** Markdown to safe HTML: raw HTML shown as text, links and images only with safe schemes. */
import { Marked, type Tokens } from 'marked'

const htmlEscapes: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }

/** Escapes text for HTML content and quoted attribute values. */
export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, char => htmlEscapes[char]!)
}

const namedEntities: Record<string, string> = {
  amp: '&',
  lt: '<',
  gt: '>',
  quot: '"',
  apos: "'",
  colon: ':',
  tab: '\t',
  newline: '\n',
}

/** Decodes the character references a browser would decode in an attribute (numeric, and a few named). */
function decodeReferences(text: string): string {
  return text.replace(/&(#[xX][0-9a-fA-F]+|#[0-9]+|[A-Za-z]+);?/g, (whole, ref: string) => {
    if (ref.startsWith('#')) {
      const code = ref[1] === 'x' || ref[1] === 'X' ? Number.parseInt(ref.slice(2), 16) : Number.parseInt(ref.slice(1), 10)
      return code > 0 && code <= 0x10ffff ? String.fromCodePoint(code) : '\uFFFD'
    }
    return namedEntities[ref.toLowerCase()] ?? whole
  })
}

const safeSchemes = new Set(['http', 'https', 'mailto', 'tel'])

/**
 * The URL to put in an href or src, or null when it must not be a link: any scheme other than
 * http, https, mailto and tel (javascript:, data:, vbscript:, ...). The check runs on what the
 * browser will see: references decoded, and the whitespace and control characters it ignores
 * removed. The result is then escaped whole, so the browser decodes back to exactly what was checked.
 */
export function safeUrl(href: string): string | null {
  const decoded = decodeReferences(href)
  const normalized = decoded.replace(/[\u0000-\u0020\u007f-\u009f]/g, '').toLowerCase()
  const scheme = /^([a-z][a-z0-9+.-]*):/.exec(normalized)
  if (scheme && !safeSchemes.has(scheme[1]!)) return null
  // A colon before any '/', '?' or '#' that is not a scheme (e.g. "1:2") would still be read as one.
  if (!scheme && /^[^/?#]*:/.test(normalized)) return null
  try {
    return encodeURI(decoded.trim()).replace(/%25/g, '%')
  } catch {
    return null
  }
}

// A setext underline, and lines that end a paragraph before marked's setext rule could reach an
// underline (each a subset of the lines that rule stops at: blank, a list item, a fence, a quote, an
// ATX heading, a thematic break, a table's delimiter row, the start of an HTML block with marked's
// own list of block tags).
const underline = /^ {0,3}(?:=+|-+)[ \t]*$/
const blockTags =
  'address|article|aside|base|basefont|blockquote|body|caption|center|col|colgroup|dd|details|dialog|dir|div|dl|dt|fieldset|' +
  'figcaption|figure|footer|form|frame|frameset|h[1-6]|head|header|hr|html|iframe|legend|li|link|main|menu|menuitem|meta|nav|' +
  'noframes|ol|optgroup|option|p|param|search|section|summary|table|tbody|td|tfoot|th|thead|title|tr|track|ul'
const paragraphEnd = new RegExp(
  '^(?:[ \\t]*|[ ]{0,3}(?:(?:[*+-]|\\d{1,9}[.)]) .*|(?:`{3,}|~{3,}|>).*|#{1,6}(?:[ \\t].*)?|(?:\\*[ \\t]*){3,}|(?:_[ \\t]*){3,}|(?:-[ \\t]*){3,}' +
    `|\\|?(?:[:\\- ]*\\|)+[:\\- ]*|<\\/?(?:${blockTags})(?:[ \\t].*|\\/?>.*)?|<(?:script|pre|style|textarea)(?:[\\s>].*)?|<(?:!--|\\?|![A-Za-z]|!\\[CDATA\\[).*))$`,
)

/**
 * Whether the block at the start of `src` can be a setext heading: marked tries its rule for one at
 * every block, and under Bun's regex engine the rule takes time quadratic in the text it runs over
 * (2 s for 30,000 characters of plain prose, past the renderer's limit). It needs an underline of `=`
 * or `-` before any line that ends the paragraph; the lines are read up to the first of either, so
 * each block start reads only its own paragraph. Without an underline the rule cannot match and is
 * skipped; with one, marked's own rule decides.
 */
export function mayBeSetextHeading(src: string): boolean {
  for (let start = src.indexOf('\n') + 1; start > 0 && start < src.length;) {
    const end = src.indexOf('\n', start)
    const line = src.slice(start, end === -1 ? src.length : end)
    if (underline.test(line)) return true
    if (paragraphEnd.test(line)) return false
    start = end + 1
  }
  return false
}

/**
 * The most HTML a post may render to, in UTF-8 bytes: 100,000 characters of Markdown that repeat a
 * long link reference render to 33 MB, which every view of the post would read and send.
 */
export const maxHtmlBytes = 2 * 1024 * 1024

/** A render that passed `maxHtmlBytes`, stopped as its links and images copy their references. */
class TooLarge extends Error {}

/** Characters the links and images of the render under way copied (a reference's URL and title, at each use). */
let copied = 0

function copy(text: string): string {
  copied += text.length
  if (copied > maxHtmlBytes) throw new TooLarge()
  return text
}

const markdown = new Marked({
  gfm: true,
  async: false,
  tokenizer: {
    // false: marked's own rule; undefined: not a setext heading, on to the next rule.
    lheading: src => (mayBeSetextHeading(src) ? false : undefined),
  },
  renderer: {
    html(token: Tokens.HTML | Tokens.Tag) {
      const text = escapeHtml(token.text)
      return 'block' in token && token.block ? `<p>${text}</p>\n` : text
    },
    link(token: Tokens.Link) {
      const text = token.tokens ? this.parser.parseInline(token.tokens) : escapeHtml(token.text)
      const href = safeUrl(token.href)
      if (href === null) return text
      const title = token.title ? ` title="${copy(escapeHtml(token.title))}"` : ''
      return `<a href="${copy(escapeHtml(href))}"${title} rel="nofollow ugc noopener">${text}</a>`
    },
    image(token: Tokens.Image) {
      const alt = token.tokens ? this.parser.parseInline(token.tokens, this.parser.textRenderer) : token.text
      const src = safeUrl(token.href)
      if (src === null) return escapeHtml(alt)
      const title = token.title ? ` title="${copy(escapeHtml(token.title))}"` : ''
      return `<img src="${copy(escapeHtml(src))}" alt="${escapeHtml(alt)}"${title} loading="lazy">`
    },
  },
})

/** Renders a post's Markdown as HTML that is safe to put in a page; null past `maxHtmlBytes`. */
export function renderMarkdown(source: string): string | null {
  copied = 0
  try {
    const html = markdown.parse(source, { async: false })
    return Buffer.byteLength(html) > maxHtmlBytes ? null : html
  } catch (error) {
    if (error instanceof TooLarge) return null
    throw error
  }
}

/** The text of a post's rendered HTML, without markup, cut to `max` characters: for descriptions and meta tags. */
export function plainText(html: string, max: number): string {
  const text = decodeReferences(html.replace(/<[^>]*>/g, ' '))
    .replace(/\s+/g, ' ')
    .trim()
  return text.length <= max ? text : `${text.slice(0, max - 1).trimEnd()}…`
}
