# Install llamay into an isolated Python environment and put `llamay` on the user's PATH.
#
#   irm <site>/install.ps1 | iex
#   powershell -ExecutionPolicy Bypass -File packaging\install.ps1 [-Prefix DIR] [-Python PATH]
#                                                                 [-Source SPEC] [-DryRun]
#
# Finds a Python >= 3.12 (the `py` launcher, then python3/python on PATH), creates a virtual
# environment in the prefix (or reuses the one there), installs llamay (CPU: JAX has no native
# CUDA build on Windows; use WSL2 and install.sh for a GPU) with pip's configured index, adds
# the environment's Scripts directory to the user's PATH and says what it did.
# Environment: LLAMAY_PREFIX, LLAMAY_PYTHON, LLAMAY_SOURCE, LLAMAY_PIP_ARGS.
[CmdletBinding()]
param(
    [string]$Prefix = $env:LLAMAY_PREFIX,
    [string]$Python = $env:LLAMAY_PYTHON,
    [string]$Source = $env:LLAMAY_SOURCE,
    [switch]$DryRun
)

$ErrorActionPreference = 'Stop'

function Say([string]$Message) { Write-Host "[llamay] $Message" }
function Fail([string]$Message) {
    # throw, not exit: under `irm ... | iex` exit would close the user's PowerShell
    throw "[llamay] error: $Message"
}
function Invoke-Native([scriptblock]$Block) {
    # Windows PowerShell 5.1 turns a native program's stderr into errors, which 'Stop' would
    # make fatal (pip writes warnings there): run native programs with 'Continue' and judge
    # them by $LASTEXITCODE.
    $ErrorActionPreference = 'Continue'
    & $Block
}
function Test-Python([string[]]$Command) {
    $exe = $Command[0]
    $rest = @($Command | Select-Object -Skip 1)
    try {
        Invoke-Native { & $exe @rest -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>$null | Out-Null }
        return $LASTEXITCODE -eq 0
    } catch {
        return $false
    }
}

# -- the system --------------------------------------------------------------------------
$isWin = ($env:OS -eq 'Windows_NT')
if (-not $isWin) {
    Fail 'install.ps1 is for Windows; on Linux and macOS use install.sh'
}
$arch = $env:PROCESSOR_ARCHITECTURE
if ($arch -ne 'AMD64') {
    Fail "llamay needs JAX, which has Windows builds only for x64 (AMD64), not $arch"
}
if (-not $Prefix) { $Prefix = Join-Path $env:LOCALAPPDATA 'llamay' }

# -- Python >= 3.12 ----------------------------------------------------------------------
$pyCmd = $null
if ($Python) {
    if (-not (Test-Python @($Python))) { Fail "-Python $Python is not a Python >= 3.12" }
    $pyCmd = @($Python)
} else {
    $candidates = @(@('py', '-3.12'), @('py', '-3.13'), @('py', '-3'), @('python3'), @('python'))
    foreach ($c in $candidates) {
        if ((Get-Command $c[0] -ErrorAction SilentlyContinue) -and (Test-Python $c)) {
            $pyCmd = $c
            break
        }
    }
    if (-not $pyCmd) {
        Fail 'llamay needs Python >= 3.12 (tried py -3.12, py -3.13, py -3, python3, python); install one from python.org, or pass -Python PATH'
    }
}
$pyExe = $pyCmd[0]
$pyArgs = @($pyCmd | Select-Object -Skip 1)
$pyVersion = Invoke-Native { & $pyExe @pyArgs -c "import sys; print('.'.join(map(str, sys.version_info[:3])))" }

# -- what to install ---------------------------------------------------------------------
if (-not $Source) {
    $Source = 'llamay'
    if ($PSCommandPath) {
        $here = Split-Path -Parent (Split-Path -Parent $PSCommandPath)
        $pyproject = Join-Path $here 'pyproject.toml'
        if ((Test-Path $pyproject) -and (Select-String -Path $pyproject -Pattern '^name = "llamay"' -Quiet)) {
            $Source = $here
        }
    }
}

Say "system: Windows $arch; Python $pyVersion ($($pyCmd -join ' '))"
Say 'backend: cpu (JAX has no native CUDA build on Windows; use WSL2 and install.sh for a GPU)'
Say "installing: $Source into $Prefix"

# -- the environment -----------------------------------------------------------------------
$venvPy = Join-Path $Prefix 'Scripts\python.exe'
$scripts = Join-Path $Prefix 'Scripts'
if ((Test-Path (Join-Path $Prefix 'pyvenv.cfg')) -and (Test-Path $venvPy)) {
    if (-not (Test-Python @($venvPy))) { Fail "$Prefix holds an environment with a Python older than 3.12; remove it first" }
    Say "reusing the environment in $Prefix"
} elseif ((Test-Path $Prefix) -and (Get-ChildItem -Force $Prefix | Select-Object -First 1)) {
    Fail "$Prefix exists and is not a Python environment; choose another -Prefix or remove it"
} elseif ($DryRun) {
    Say "would run: $($pyCmd -join ' ') -m venv $Prefix"
} else {
    Invoke-Native { & $pyExe @pyArgs -m venv $Prefix }
    if ($LASTEXITCODE -ne 0) { Fail "could not create an environment in $Prefix" }
}

$pipArgs = @()
if ($env:LLAMAY_PIP_ARGS) { $pipArgs = $env:LLAMAY_PIP_ARGS -split '\s+' | Where-Object { $_ } }
$log = Join-Path $Prefix 'install.log'
if ($DryRun) {
    Say "would run: $venvPy -m pip install $($pipArgs -join ' ') $Source"
    Say "would add $scripts to the user's PATH"
    Say 'dry run: nothing was changed'
    return
}
Invoke-Native { & $venvPy -m pip install --disable-pip-version-check @pipArgs $Source *> $log }
if ($LASTEXITCODE -ne 0) {
    Get-Content $log -Tail 30 | Write-Host
    Fail "pip could not install $Source (full log: $log)"
}

# -- on PATH -------------------------------------------------------------------------------
$llamay = Join-Path $scripts 'llamay.exe'
Invoke-Native { & $llamay --help *> $null }
if ($LASTEXITCODE -ne 0) { Fail "installed, but '$llamay --help' fails; see $log" }
$version = Invoke-Native { & $venvPy -c "import llamay; print(llamay.__version__)" }

$userPath = [Environment]::GetEnvironmentVariable('Path', 'User')
$parts = @()
if ($userPath) { $parts = $userPath -split ';' | Where-Object { $_ } }
Say "installed llamay $version (cpu) into $Prefix"
if ($parts -notcontains $scripts) {
    [Environment]::SetEnvironmentVariable('Path', (@($parts) + $scripts) -join ';', 'User')
    Say "added $scripts to your user PATH (open a new terminal to use it)"
} else {
    Say "$scripts is already on your user PATH"
}
Say 'try: llamay generate "Once upon a time"'
Say "to remove llamay: delete $Prefix (models stay in `$env:LLAMAY_HOME, default ~\.llamay)"
