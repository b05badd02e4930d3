/** The Markdown renderer's thread (render.ts): renders each post it is sent and sends the HTML back. */
import { renderMarkdown } from './markdown.ts'

declare const self: Worker

self.onmessage = (event: MessageEvent<string>) => {
  let html: string | null
  try {
    html = renderMarkdown(event.data)
  } catch {
    // marked recursing past the stack on thousands of nested quotes or lists: not renderable.
    html = null
  }
  postMessage(html)
}
