// npm's `prepare` step: builds dist/ from src/ when the package is installed from its folder
// (`npm install path/to/clients/typescript`), packed, or set up with `npm ci` here. Installed
// from a folder, npm runs this in the folder but installs none of its dev dependencies, so the
// compiler is first installed here, at the versions of package-lock.json, when it is missing.

import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(here, "node_modules", "typescript", "bin", "tsc");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

if (!existsSync(tsc)) {
  // The installing npm's settings (its prefix, what it saves where) are for the project being
  // installed into, not for this folder.
  const environment = Object.fromEntries(
    Object.entries(process.env).filter(([name]) => !name.toLowerCase().startsWith("npm_")),
  );
  console.error("@tollgate/client: installing its build tools (npm ci) to build dist/");
  execFileSync(npm, ["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"], {
    cwd: here,
    env: environment,
    stdio: ["ignore", "inherit", "inherit"],
    shell: process.platform === "win32",
  });
  // scripts/test reinstalls only when the lock file has changed since this copy.
  copyFileSync(join(here, "package-lock.json"), join(here, "node_modules", ".tollgate-package-lock.json"));
}
execFileSync(process.execPath, [tsc, "-p", join(here, "tsconfig.build.json")], { cwd: here, stdio: "inherit" });
