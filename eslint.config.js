// The lint run: rules that catch what the type check cannot (a promise whose rejection nobody
// handles, an await of what is no promise, a switch missing a case, code never reached). Formatting
// is Prettier's; `npm run lint` runs it over every file the type check covers.
import tseslint from 'typescript-eslint'

export default tseslint.config(
  { ignores: ['node_modules/', 'test/client/', '.data/'] },
  {
    files: ['**/*.ts'],
    languageOptions: {
      parser: tseslint.parser,
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    plugins: { '@typescript-eslint': tseslint.plugin },
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      // `Promise.all` of what may be a promise or not (a step skipped as `undefined`) waits as well.
      '@typescript-eslint/await-thenable': ['error', { allowMixedPromiseArrays: true }],
      '@typescript-eslint/no-unnecessary-type-assertion': 'error',
      '@typescript-eslint/switch-exhaustiveness-check': 'error',
      'no-unreachable': 'error',
      'no-fallthrough': 'error',
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrorsIgnorePattern: '^_', destructuredArrayIgnorePattern: '^_' },
      ],
      '@typescript-eslint/only-throw-error': 'error',
    },
  },
  {
    // bun-types declares `expect(promise).rejects.toThrow()` (and `.resolves`) as returning void,
    // where Bun returns the promise the test must await: the rule would ask to drop those awaits.
    files: ['test/**/*.ts'],
    rules: { '@typescript-eslint/await-thenable': 'off' },
  },
)
