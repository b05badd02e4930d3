/** Named schemas: every TypeBox schema with an `$id` becomes one entry of `components.schemas`, referenced where it is used. */

export type Schema = { [key: string]: unknown }

const ref = (name: string) => ({ $ref: `#/components/schemas/${name}` })

/** Keys whose value is one schema, a list of schemas, or a map of them (JSON Schema 2020-12). */
const oneSchema = ['items', 'additionalProperties', 'not', 'contains', 'propertyNames', 'if', 'then', 'else', 'unevaluatedProperties']
const schemaLists = ['anyOf', 'oneOf', 'allOf', 'prefixItems']
const schemaMaps = ['properties', 'patternProperties', '$defs']

/**
 * Collects named schemas: `hoist(schema)` returns the schema with every part that has an `$id`
 * replaced by a reference to `components.schemas[$id]`, which it fills. The TypeBox schemas stay the
 * one source: a schema is named where it is defined (`t.Object({...}, { $id: 'Plan' })`), and each
 * name must stand for one schema only. Works on a plain copy of the document (it changes what it is given).
 */
export function namedSchemas() {
  const components: Record<string, Schema> = {}
  const texts = new Map<string, string>()
  const hoist = (schema: Schema): Schema => {
    for (const key of oneSchema) if (isSchema(schema[key])) schema[key] = hoist(schema[key])
    for (const key of schemaLists) {
      if (Array.isArray(schema[key])) schema[key] = (schema[key] as unknown[]).map(item => (isSchema(item) ? hoist(item) : item))
    }
    for (const key of schemaMaps) {
      const map = schema[key]
      if (!isSchema(map)) continue
      for (const [name, child] of Object.entries(map)) if (isSchema(child)) map[name] = hoist(child)
    }
    const name = schema.$id
    if (typeof name !== 'string') return schema
    // An `$id` inside the document would change what the references under it resolve against.
    delete schema.$id
    const text = JSON.stringify(schema)
    if ((texts.get(name) ?? text) !== text) throw new Error(`Two different schemas are named ${name}`)
    texts.set(name, text)
    components[name] = schema
    return ref(name)
  }
  return { hoist, components }
}

function isSchema(value: unknown): value is Schema {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}
