/** Runs once per test process: makes sure the migrated template database for this schema exists. */
import { prepareTemplate } from '../helpers/database.ts'

process.env.AM_TEST_TEMPLATE = await prepareTemplate()
